"""Admin (Liu et al. 2020, arXiv 2004.08249), registered as fairseq model ``admin``.

Every sublayer ``i`` of a stack, ``F`` its output after dropout::

    x_{i+1} = LN(omega_i * x_i + F(x_i))

``omega_i`` is a learned vector (one weight per model dimension) per sublayer,
initialised from a profiling pass over real batches, as the reference
implementation (LiyuanLucasLiu/Transformer-Clinic, ``--init-type
adaptive-profiling`` then ``adaptive``) does, one stack at a time::

    omega_1 = 1
    omega_{i+1} = sqrt(Var[omega_i * x_i] + Var[F_i(x_i)])

in the order the sublayers run, each variance taken over every element of the
batch's real (non-padding) tokens, with the model in training mode (dropout on)
and ``omega_1..omega_i`` already set while ``F_i`` is measured. ``omega_i^2``
thus accumulates the variance of the sublayer outputs below sublayer ``i`` (plus
that of the stack's input): it matches the residual branch to the size the
Pre-LN stream would have there, which is what keeps Post-LN's output from depending
too strongly on the residual branches early in training. Each value fills its whole
vector; the vectors are then trained like any other parameter.

The two steps are joined by a file: :func:`profile_omegas` measures them on a
freshly initialised model, :func:`write_profile` stores them as JSON, and the model
option ``--admin-profile FILE`` initialises a new model from them
(:func:`read_profile` checks the file first). ``residual-fairseq-train --variant
admin`` runs both steps as one command (see :mod:`residual_fairseq.admin_profile`).
Without ``--admin-profile`` every omega is 1 (the profiling start) and a warning says
so; a checkpoint carries its trained omegas in its weights either way.
"""
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig

from ..argtypes import is_finite_number, read_regular_file
from ..atomic import write_text_atomically
from ..checkpoints import WEIGHTS_FROM_CHECKPOINT
from .postln_family import PostLNFamilyModel, fairseq_preset_of, register_presets, stacks_with
from .postln_layers import ModelConfigError, PostLNDecoderLayer, PostLNEncoderLayer

logger = logging.getLogger(__name__)

PROFILE_FORMAT = "residual-fairseq admin omega profile"
PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 4 * 1024 * 1024  # ~1000 layers need a few tens of kilobytes


@dataclass
class AdminConfig(TransformerConfig):
    admin_profile: Optional[str] = field(
        default=None,
        metadata={"help": "JSON file of profiled Admin omegas that initialises a new model "
                  "(python3 -m residual_fairseq.admin_profile writes it; residual-fairseq-train "
                  "--variant admin does both). Without it every omega starts at 1"},
    )


def _omega(dim: int) -> nn.Parameter:
    return nn.Parameter(torch.ones(dim))


class AdminEncoderLayer(PostLNEncoderLayer):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.omega_self_attn = _omega(self.embed_dim)
        self.omega_ffn = _omega(self.embed_dim)

    def combine(self, sublayer: int, out: Tensor, residual: Tensor, layer_input: Tensor) -> Tensor:
        if sublayer == self.SELF_ATTN:
            return residual * self.omega_self_attn + out
        return residual * self.omega_ffn + out


class AdminDecoderLayer(PostLNDecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        self.omega_self_attn = _omega(self.embed_dim)
        self.omega_cross_attn = _omega(self.embed_dim) if self.encoder_attn is not None else None
        self.omega_ffn = _omega(self.embed_dim)

    def combine(self, sublayer: int, out: Tensor, residual: Tensor, layer_input: Tensor) -> Tensor:
        if sublayer == self.SELF_ATTN:
            return residual * self.omega_self_attn + out
        if sublayer == self.CROSS_ATTN:
            omega = self.omega_cross_attn
            assert omega is not None
            return residual * omega + out
        return residual * self.omega_ffn + out


def sublayer_omegas(layer) -> List[nn.Parameter]:
    """A layer's omegas in the order its sublayers run."""
    omegas = [layer.omega_self_attn, getattr(layer, "omega_cross_attn", None), layer.omega_ffn]
    return [omega for omega in omegas if omega is not None]


AdminEncoder, AdminDecoder = stacks_with(AdminEncoderLayer, AdminDecoderLayer, "Admin")


# --- the profile file -----------------------------------------------------------------------

def _reject_constant(name):
    raise ValueError(f"{name} is not a number")


def read_profile(path) -> Dict[str, List[List[float]]]:
    """Read and check an omega profile: ``{"encoder": [[...] per layer], "decoder": [...]}``.

    The file is JSON (no code runs when reading it); anything but lists of finite
    positive numbers under the expected header is refused with one line.
    """
    # A regular file only: a device or a pipe named by a (hostile) config could block or never end.
    raw = read_regular_file(path, MAX_PROFILE_BYTES, "Admin profile", ModelConfigError, kind="profile")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).splitlines()[0]
        raise ModelConfigError(f"Admin profile {path} is not a valid JSON profile: {reason}") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ModelConfigError(f"Admin profile {path} lacks the header format={PROFILE_FORMAT!r}")
    if data.get("version") != PROFILE_VERSION:
        raise ModelConfigError(f"Admin profile {path}: unsupported version {data.get('version')!r}")
    profile = {}
    for stack in ("encoder", "decoder"):
        layers = data.get(stack)
        if not isinstance(layers, list) or not all(isinstance(layer, list) for layer in layers):
            raise ModelConfigError(f"Admin profile {path}: {stack!r} must be a list of lists of omegas")
        for layer in layers:
            for value in layer:
                if not is_finite_number(value) or value <= 0:
                    raise ModelConfigError(f"Admin profile {path}: omega {value!r} is not a finite positive number")
        profile[stack] = [[float(value) for value in layer] for layer in layers]
    return profile


def write_profile(profile: Dict[str, List[List[float]]], path, details: Optional[dict] = None) -> Path:
    """Store a profile as JSON (atomically); ``details`` records how it was measured."""
    data = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **(details or {}),
            "encoder": profile["encoder"], "decoder": profile["decoder"]}
    path = Path(path)
    write_text_atomically(path, json.dumps(data, indent=1) + "\n")
    return path


def _plain_layers(stack) -> list:
    return list(stack.layers)


def apply_profile(model, profile: Dict[str, List[List[float]]], source: str = "profile") -> None:
    """Fill every omega of ``model`` with its profiled value; the layouts must match."""
    for stack in ("encoder", "decoder"):
        layers = _plain_layers(getattr(model, stack))
        values = profile[stack]
        if len(values) != len(layers):
            raise ModelConfigError(
                f"Admin {source} has {len(values)} {stack} layers, the model {len(layers)}: "
                "profile the model you train"
            )
        for index, (layer, layer_values) in enumerate(zip(layers, values)):
            omegas = sublayer_omegas(layer)
            if len(layer_values) != len(omegas):
                raise ModelConfigError(
                    f"Admin {source}: {stack} layer {index} has {len(layer_values)} omegas, "
                    f"the model's layer {len(omegas)}"
                )
            with torch.no_grad():
                for omega, value in zip(omegas, layer_values):
                    omega.fill_(value)


def model_omegas(model) -> Dict[str, List[List[float]]]:
    """The mean of each omega vector, in the profile's layout."""
    return {stack: [[omega.detach().float().mean().item() for omega in sublayer_omegas(layer)]
                    for layer in _plain_layers(getattr(model, stack))]
            for stack in ("encoder", "decoder")}


# --- profiling ------------------------------------------------------------------------------

class _SublayerCapture:
    """Hooks on one layer: each sublayer's residual input and its output F (after dropout)."""

    def __init__(self, layer):
        self.residuals: List[Tensor] = []
        self.outputs: List[Tensor] = []
        norms = [layer.self_attn_layer_norm, getattr(layer, "encoder_attn_layer_norm", None)]
        self.handles = [layer.register_forward_pre_hook(lambda module, args: self.residuals.append(args[0]))]
        self.handles += [norm.register_forward_hook(lambda module, args, out: self.residuals.append(out))
                         for norm in norms if norm is not None]
        # fairseq's layer applies its dropout_module exactly once to each sublayer's output.
        self.handles.append(layer.dropout_module.register_forward_hook(
            lambda module, args, out: self.outputs.append(out)))

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _real_tokens(x: Tensor, mask: Tensor) -> Tensor:
    """(time, batch, C) -> (real tokens, C), in float64 for the variance."""
    return x.detach().transpose(0, 1)[mask].double()


def profile_omegas(model, samples: List[dict], seed: int = 1) -> Dict[str, List[List[float]]]:
    """Profile ``model``'s omegas on ``samples`` (fairseq batches), set them, and return them.

    One forward pass per sublayer, each from the same random state, so that dropout
    draws the same masks every time and pass ``k`` sees exactly what the reference's
    single profiling pass sees at sublayer ``k`` (with omegas ``1..k`` set).
    """
    if not samples:
        raise ValueError("profile_omegas needs at least one batch")
    was_training = model.training
    model.train()
    profile = {"encoder": [], "decoder": []}
    try:
        for stack in ("encoder", "decoder"):
            ratio = 1.0
            for layer in _plain_layers(getattr(model, stack)):
                for omega in sublayer_omegas(layer):
                    omega.data.fill_(1.0)
            for layer_index, layer in enumerate(_plain_layers(getattr(model, stack))):
                layer_values = []
                for sublayer, omega in enumerate(sublayer_omegas(layer)):
                    with torch.no_grad():
                        omega.fill_(ratio)
                    layer_values.append(ratio)
                    residual, out = _measure(model, stack, layer, sublayer, samples, seed)
                    if residual.numel() == 0:
                        raise ModelConfigError(f"Admin profiling: {stack} layer {layer_index} did not run "
                                               "(LayerDrop?); profile without --*-layerdrop")
                    ratio = math.sqrt((residual * ratio).var(unbiased=False).item() + out.var(unbiased=False).item())
                profile[stack].append(layer_values)
    finally:
        model.train(was_training)
    return profile


def _measure(model, stack, layer, sublayer, samples, seed):
    """(residual input, F) of one sublayer over all samples' real tokens."""
    residuals, outputs = [], []
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for sample in samples:
            net_input = sample["net_input"]
            if stack == "encoder":
                mask = net_input["src_tokens"].ne(model.encoder.padding_idx)
            else:
                mask = net_input["prev_output_tokens"].ne(model.decoder.padding_idx)
            capture = _SublayerCapture(layer)
            try:
                if stack == "encoder":
                    model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
                else:
                    model(**net_input)
            finally:
                capture.remove()
            if len(capture.outputs) > sublayer:
                residuals.append(_real_tokens(capture.residuals[sublayer], mask))
                outputs.append(_real_tokens(capture.outputs[sublayer], mask))
    if not residuals:
        return torch.empty(0), torch.empty(0)
    return torch.cat(residuals), torch.cat(outputs)


# --- the model ------------------------------------------------------------------------------

@register_model("admin")
class AdminModel(PostLNFamilyModel):
    """Post-LN with profiled, learned per-dimension residual weights omega."""

    config_class = AdminConfig
    scheme = "admin"
    encoder_class = AdminEncoder
    decoder_class = AdminDecoder

    @classmethod
    def base_architecture(cls, args):
        admin_base(args)

    @classmethod
    def after_build(cls, model, cfg) -> None:
        if cfg.admin_profile is not None and not isinstance(cfg.admin_profile, str):
            raise ModelConfigError(f"--admin-profile must be a file name, got {cfg.admin_profile!r}")
        if cfg.admin_profile == WEIGHTS_FROM_CHECKPOINT:
            return  # built to load a checkpoint: its trained omegas replace these
        if cfg.admin_profile:
            apply_profile(model, read_profile(cfg.admin_profile), source=f"profile {cfg.admin_profile}")
            logger.info(f"Admin omegas initialised from {cfg.admin_profile}")
        else:
            logger.warning("Admin omegas start at 1 (no --admin-profile): right for profiling or for "
                           "loading a checkpoint, not for training a new model")


def _admin_defaults(args):
    if getattr(args, "admin_profile", None) == "":
        args.admin_profile = None


ARCHITECTURES = register_presets("admin", _admin_defaults)
admin_base = ARCHITECTURES["admin"]
FAIRSEQ_PRESET_OF = fairseq_preset_of("admin")
