"""Per-layer measurements of a fairseq encoder-decoder, taken with hooks.

Nothing here re-implements a forward pass: :class:`StackProbe` attaches forward
(pre-)hooks to the layers of one stack (``model.encoder.layers[i]``) and tensor
hooks to their inputs, and :func:`measure` runs the model's own forward and the
criterion's own loss on real batches.
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from ..models.resi_dual import carries_dual_stream
from .similarity import linear_cka, mean_token_cosine

STACKS = ("encoder", "decoder")


def _layer_output(output):
    # Encoder layers return x (or (x, fc_result)), decoder layers (x, attn, state),
    # ResiDual layers (x, d) and (x, d, attn).
    return output[0] if isinstance(output, tuple) else output


def _tokens(x: Tensor, mask: Tensor) -> Tensor:
    """(time, batch, channels) -> (non-pad tokens, channels); mask is (batch, time)."""
    return x.detach().transpose(0, 1)[mask].float()


@dataclass
class StackMeasurement:
    """Everything measured on one stack; lists are indexed by layer (0 = lowest)."""

    param_grad_norm: List[float]
    input_grad_norm: List[float]
    output_norm: List[float]                  # mean L2 norm of a token's layer output
    cos_next: List[float]                     # layer i vs layer i+1 (one fewer entry)
    cos_last: List[float]                     # layer i vs the top layer
    cka_next: List[float]
    cka_last: List[float]
    dual_norm: Optional[List[float]] = None   # ResiDual: mean L2 norm of d after layer i
    dual_max_abs: Optional[List[float]] = None  # ResiDual: largest |d| entry (fp16 tops out at 65504)
    dual_cos_next: Optional[List[float]] = None


class StackProbe:
    """Records, for every layer of one stack, what :func:`measure` needs.

    For each forward pass the caller sets ``mask`` (batch, time; True at real
    tokens). Per layer it keeps the non-pad rows of the layer's output, of the
    ResiDual dual stream ``d`` after the layer (the second value a ResiDual
    layer returns), and the
    squared norm of the loss gradient w.r.t. the layer's input, summed over passes.
    """

    def __init__(self, layers: nn.ModuleList):
        self.layers = layers
        n = len(layers)
        self.mask: Optional[Tensor] = None
        self.outputs: List[List[Tensor]] = [[] for _ in range(n)]
        self.dual: List[List[Tensor]] = [[] for _ in range(n)]
        self.dual_max_abs = [0.0] * n
        self.input_grad_sq = [0.0] * n
        self.handles = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre_hook(i)))
            self.handles.append(layer.register_forward_hook(self._post_hook(i)))

    @property
    def has_dual_stream(self) -> bool:
        return all(carries_dual_stream(layer) for layer in self.layers)

    def _pre_hook(self, i):
        def hook(module, args):
            x = args[0]
            if x.requires_grad:
                x.register_hook(lambda grad: self._add_input_grad(i, grad))
        return hook

    def _add_input_grad(self, i, grad):
        self.input_grad_sq[i] += grad.detach().double().pow(2).sum().item()

    def _post_hook(self, i):
        def hook(module, args, output):
            self.outputs[i].append(_tokens(_layer_output(output), self.mask))
            if carries_dual_stream(module):
                d = _tokens(output[1], self.mask)
                self.dual[i].append(d)
                self.dual_max_abs[i] = max(self.dual_max_abs[i], d.abs().max().item())
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def result(self) -> StackMeasurement:
        outputs = [torch.cat(rows) for rows in self.outputs]
        top = outputs[-1]
        n = len(outputs)
        m = StackMeasurement(
            param_grad_norm=[_param_grad_norm(layer) for layer in self.layers],
            input_grad_norm=[g ** 0.5 for g in self.input_grad_sq],
            output_norm=[o.norm(dim=-1).mean().item() for o in outputs],
            cos_next=[mean_token_cosine(outputs[i], outputs[i + 1]) for i in range(n - 1)],
            cos_last=[mean_token_cosine(o, top) for o in outputs],
            cka_next=[linear_cka(outputs[i], outputs[i + 1]) for i in range(n - 1)],
            cka_last=[linear_cka(o, top) for o in outputs],
        )
        if self.has_dual_stream:
            dual = [torch.cat(rows) for rows in self.dual]
            m.dual_norm = [d.norm(dim=-1).mean().item() for d in dual]
            m.dual_max_abs = list(self.dual_max_abs)
            m.dual_cos_next = [mean_token_cosine(dual[i], dual[i + 1]) for i in range(n - 1)]
        return m


def _param_grad_norm(module: nn.Module) -> float:
    squares = [p.grad.detach().double().pow(2).sum() for p in module.parameters() if p.grad is not None]
    return torch.stack(squares).sum().sqrt().item() if squares else 0.0


@dataclass
class Measurement:
    loss: float                               # criterion loss per target token, base 2 (as fairseq logs it)
    stacks: Dict[str, StackMeasurement] = field(default_factory=dict)
    # The same loss with every target paired with another sentence's source: equal to
    # ``loss`` when the model ignores its source. None for a language model (no source).
    loss_other_source: Optional[float] = None

    @property
    def source_gain(self) -> Optional[float]:
        """Bits per target token the source is worth: 0 when the model ignores it."""
        return None if self.loss_other_source is None else self.loss_other_source - self.loss


def model_stacks(model) -> List[str]:
    """The stacks a model has: encoder and decoder, or (a language model) the decoder."""
    return [name for name in STACKS if getattr(model, name, None) is not None]


def stack_masks(model, sample) -> Dict[str, Tensor]:
    """(batch, time) masks of the real tokens each stack's layers see."""
    net_input = sample["net_input"]
    if "prev_output_tokens" not in net_input:  # a language model: src_tokens is the decoder's input
        return {"decoder": net_input["src_tokens"].ne(model.decoder.padding_idx)}
    return {
        "encoder": net_input["src_tokens"].ne(model.encoder.padding_idx),
        "decoder": net_input["prev_output_tokens"].ne(model.decoder.padding_idx),
    }


def with_other_sources(sample):
    """``sample`` with each sentence's source replaced by the next one's in the batch.

    Batches are grouped by length, so a target keeps a source of about its own length:
    what it loses is what the source says. (Needs 2 or more sentences in the batch.)
    """
    net_input = dict(sample["net_input"])
    for key in ("src_tokens", "src_lengths"):
        net_input[key] = net_input[key].roll(1, dims=0)
    return {**sample, "net_input": net_input}


def loss_with_other_sources(model, criterion, batches) -> Optional[float]:
    """Loss per target token (base 2) with :func:`with_other_sources`; None for a language
    model, or when some batch has a single sentence (there is no other source to give it)."""
    if getattr(model, "encoder", None) is None or any(sample["nsentences"] < 2 for sample in batches):
        return None
    with torch.no_grad():
        total = sum(criterion(model, with_other_sources(sample))[0].item() for sample in batches)
    return total / sum(sample["ntokens"] for sample in batches) / math.log(2)


def measure(model, criterion, batches) -> Measurement:
    """Gradient norms, similarities and stream magnitudes on ``batches``.

    Dropout is off (``model.eval()``) so a measurement is a deterministic function
    of the weights; gradients are still computed. The loss is normalised by the
    total number of target tokens over all batches, as fairseq's trainer does for
    one update, so the gradients are those of that update; the model's ``.grad``
    fields are left holding them.
    """
    if not batches:
        raise ValueError("measure() needs at least one batch")
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    probes = {name: StackProbe(getattr(model, name).layers) for name in model_stacks(model)}
    total_tokens = sum(sample["ntokens"] for sample in batches)
    total_loss = 0.0
    try:
        for sample in batches:
            for name, mask in stack_masks(model, sample).items():
                probes[name].mask = mask
            loss, _, _ = criterion(model, sample)
            (loss / total_tokens).backward()
            total_loss += loss.item()
        result = Measurement(loss=total_loss / total_tokens / torch.log(torch.tensor(2.0)).item())
        result.stacks = {name: probe.result() for name, probe in probes.items()}
        for probe in probes.values():  # the extra forward passes below are not measured
            probe.remove()
        result.loss_other_source = loss_with_other_sources(model, criterion, batches)
    finally:
        for probe in probes.values():
            probe.remove()
        model.train(was_training)
    return result
