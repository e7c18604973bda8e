"""One real training update, shared by the speed and the depth benchmarks.

The loss is fairseq's ``label_smoothed_cross_entropy`` criterion; the update is
Adam with fairseq's transformer betas. Mixed precision uses ``torch.autocast`` (what
fairseq's ``--amp`` does), with a gradient scaler for fp16.
"""
import math
from contextlib import nullcontext

import torch
from fairseq import utils
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from ..errors import UserError
from ..fairseq_data import is_language_modeling, joined_dictionary
from ..variants import build_language_model, build_model

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: this torch has no CUDA device")
    return torch.device(name)


def check_precision(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: choose from {', '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA device (use bf16 on CPU)")


def autocast(device: torch.device, precision: str):
    dtype = PRECISIONS[precision]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def build_variant(task, variant, preset="", **overrides):
    """A fresh ``variant`` model for ``task``'s dictionaries, embeddings shared when they can be.

    For a language-modeling task: fairseq's transformer_lm (Post-LN / Pre-LN) or
    resi_dual_lm, with the sizes of fairseq's ``transformer_lm_<preset>`` and the
    decoder options of ``overrides`` (encoder options are dropped).
    """
    if is_language_modeling(task):
        return build_lm_variant(task, variant, preset, **overrides)
    sharing = (
        {"share_all_embeddings": True} if joined_dictionary(task)
        else {"share_decoder_input_output_embed": True}
    )
    return build_model(
        variant, preset, task.source_dictionary, task.target_dictionary, **{**sharing, **overrides}
    )


LM_SIZE_OPTIONS = ("decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads", "activation_fn",
                   "dropout", "attention_dropout", "decoder_learned_pos")


def lm_preset_sizes(preset: str) -> dict:
    """The size options of fairseq's ``transformer_lm_<preset>`` (``""``: transformer_lm's defaults)."""
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    if not preset:
        return {}
    args = Namespace()
    ARCH_CONFIG_REGISTRY[f"transformer_lm_{preset}"](args)
    return {name: getattr(args, name) for name in LM_SIZE_OPTIONS if hasattr(args, name)}


def build_lm_variant(task, variant, preset="", **overrides):
    options = {**lm_preset_sizes(preset), **{k: v for k, v in overrides.items() if not k.startswith("encoder_")}}
    width = options.get("decoder_embed_dim", 512)
    options.setdefault("decoder_input_dim", width)
    options.setdefault("decoder_output_dim", width)
    return build_language_model(variant, task.source_dictionary, share_decoder_input_output_embed=True,
                                tokens_per_sample=task.args.tokens_per_sample, **options)


def to_device(batch, device):
    return utils.move_to_cuda(batch, device) if device.type == "cuda" else batch


class Trainer:
    """Forward, backward and an Adam step on one batch; returns the loss in bits per token."""

    def __init__(self, task, model, device, precision="fp32", lr=5e-4, lr_schedule=None,
                 label_smoothing=0.1):
        self.model = model
        self.device = device
        self.precision = precision
        self.criterion = LabelSmoothedCrossEntropyCriterion(
            task, sentence_avg=False, label_smoothing=label_smoothing
        )
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8)
        self.scheduler = (
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule) if lr_schedule else None
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(self, batch) -> float:
        self.model.train()
        with autocast(self.device, self.precision):
            loss, sample_size, _ = self.criterion(self.model, batch)
        # fairseq divides the gradients by the sample size; dividing the loss is the same.
        self.scaler.scale(loss / sample_size).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return loss.item() / sample_size / math.log(2)

    @torch.no_grad()
    def loss(self, batches) -> float:
        """Loss in bits per token over ``batches``, in eval mode (no dropout)."""
        self.model.eval()
        total, tokens = 0.0, 0
        for batch in batches:
            with autocast(self.device, self.precision):
                loss, sample_size, _ = self.criterion(self.model, batch)
            total += loss.item()
            tokens += sample_size
        return total / tokens / math.log(2)
