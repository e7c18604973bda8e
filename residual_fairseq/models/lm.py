"""The ResiDual language model, registered as fairseq model ``resi_dual_lm``.

A decoder-only ResiDual for fairseq's ``language_modeling`` task. It is fairseq's
:class:`~fairseq.models.transformer_lm.TransformerLanguageModel` (options, input
embeddings, hub interface, eval-lm) whose decoder is the project's
:class:`~residual_fairseq.models.resi_dual.ResiDualDecoder` without cross-attention:
the same dual-stream code as the translation model, no second copy of the formula.

Registration follows fairseq's ``transformer_lm``: a flat config dataclass (so both
``fairseq-train --arch resi_dual_lm_*`` and ``fairseq-hydra-train`` with
``model._name: resi_dual_lm`` work) plus named presets. ``dual_scale_decoder`` is a
field of that dataclass, so it survives fairseq's conversion of the flat command line
into a config (which keeps only dataclass fields) and the hydra path.

Every preset ``resi_dual_lm_X`` has the sizes of fairseq's ``transformer_lm_X``. Two
things differ on purpose, because they are the residual scheme itself: fairseq's
presets force ``decoder_normalize_before=True`` (Pre-LN), ResiDual's main stream is
Post-LN; and ``transformer_lm_wiki103`` drops the final norm, while LN(d_N) is part of
ResiDual's output. The Post-LN and Pre-LN baselines are fairseq's own ``transformer_lm``
arch without/with ``--decoder-normalize-before`` (its named presets are always Pre-LN).
"""
import contextlib
import types
from dataclasses import dataclass, field

import numpy as np

from omegaconf import OmegaConf, open_dict

from fairseq.models import ARCH_CONFIG_REGISTRY, register_model
from fairseq.models.transformer import Embedding
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)
from fairseq.modules import AdaptiveInput
from fairseq.utils import safe_getattr

from ..argtypes import positive_number
from ..checkpoints import CodeInConfigError, literal_value
from .postln_family import fairseq_preset_of, register_presets, set_option_types
from .postln_layers import ModelConfigError
from .resi_dual import ResiDualConfig, ResiDualDecoder, ResiDualModel


def _restore_numpy_compat_long():
    """fairseq 0.12's language-model inference (``TokenBlockDataset(break_mode="eos")``, used
    by the hub's sample/score and fairseq-interactive) reads ``np.compat.long``, which numpy 2
    removed; it was the C long, int64 on the platforms fairseq supports."""
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=np.int64)


_restore_numpy_compat_long()


class ResiDualLanguageModelError(ModelConfigError):
    """A language-model option that resi_dual_lm cannot honour."""


@dataclass
class ResiDualLanguageModelConfig(TransformerLanguageModelConfig):
    dual_scale_decoder: float = field(
        default=1.0,
        metadata={
            "help": "scale s of the dual stream (d_0 = s*x_0, d += s*F); LN_final makes the "
            "output independent of s, so s < 1 only keeps d inside fp16 range in deep models"
        },
    )
    main_alpha_decoder: float = field(
        default=1.0,
        metadata={"help": "weight alpha of the main stream in the output y = alpha * x_N + LN(d_N) (the paper: 1)"},
    )


def parse_cutoffs(value, option):
    """``"20000,60000"``, ``"[20000, 60000]"``, ``"(20000, 60000)"`` or ``"20000"`` ->
    ``[20000, 60000]`` / ``[20000]``: the forms fairseq's ``eval_str_list`` accepts, read
    with the project's literal-only parser (fairseq ``eval``s this string, and a
    checkpoint's config is untrusted input); a list of ints is taken as it is."""
    if value is None:
        return None
    original = value
    if OmegaConf.is_list(value):
        value = list(value)
    if isinstance(value, str):
        try:
            value = literal_value(value)
        except CodeInConfigError:
            value = None  # refused below with the option's name
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, (list, tuple)):  # "2e4,6e4": fairseq's int() takes whole floats too
        value = [int(item) if isinstance(item, float) and item.is_integer() else item for item in value]
    if not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise ResiDualLanguageModelError(
            f"--{option.replace('_', '-')} wants comma-separated integers or a list of them "
            f"(20000,60000 or [20000, 60000]), got {_shown(original)}"
        )
    return list(value)


def _shown(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def validate(args, cfg) -> None:
    """Reject options that contradict the ResiDual formula (the translation model's checks,
    one place) or that this language model does not build."""
    ResiDualModel.validate(cfg)
    if args.character_embeddings:
        # fairseq builds these from eval(--character-filters); not worth that risk here.
        raise ResiDualLanguageModelError("--character-embeddings is not supported by resi_dual_lm")
    if safe_getattr(args, "base_layers", 0):
        raise ResiDualLanguageModelError("--base-layers is not supported by resi_dual_lm")


def _editable(args):
    return open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext()


@register_model("resi_dual_lm", dataclass=ResiDualLanguageModelConfig)
class ResiDualLanguageModel(TransformerLanguageModel):
    """fairseq's transformer language model with a ResiDual decoder (Xie et al., 2023)."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        # Check numbers while parsing, so a bad value is one argparse error line.
        set_option_types(parser, {"dual_scale_decoder": positive_number(float),
                                  "main_alpha_decoder": positive_number(float),
                                  "decoder_layers": positive_number(int)})

    @classmethod
    def build_model(cls, args, task):
        with _editable(args):
            if safe_getattr(args, "decoder_layers_to_keep", None):
                args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
            if safe_getattr(args, "max_target_positions", None) is None:
                args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        cfg = ResiDualConfig.from_namespace(args)
        # from_namespace copies a DictConfig's known fields only (the CLI path hands one
        # over too): keep the language-model options TransformerConfig lacks (scale_attn...).
        keys = args.keys() if OmegaConf.is_config(args) else vars(args).keys()
        for name in keys:
            if not hasattr(cfg, name) and not name.startswith("decoder_"):
                setattr(cfg, name, safe_getattr(args, name))
        for name in ("dual_scale_decoder", "main_alpha_decoder"):
            setattr(cfg, name, safe_getattr(args, name, 1.0))
        validate(args, cfg)
        cfg.adaptive_softmax_cutoff = parse_cutoffs(args.adaptive_softmax_cutoff, "adaptive_softmax_cutoff")
        embed_tokens = cls.build_input_embedding(args, task.source_dictionary)
        if args.tie_adaptive_weights and not (
            args.adaptive_input
            and args.adaptive_input_factor == args.adaptive_softmax_factor
            and cfg.adaptive_softmax_cutoff == parse_cutoffs(args.adaptive_input_cutoff, "adaptive_input_cutoff")
            and args.decoder_input_dim == args.decoder_output_dim
        ):
            raise ResiDualLanguageModelError(
                "--tie-adaptive-weights needs --adaptive-input with the same factor, cutoffs and "
                "input/output dims as the adaptive softmax"
            )
        decoder = ResiDualDecoder(cfg, task.target_dictionary, embed_tokens, no_encoder_attn=True)
        return cls(decoder)

    @classmethod
    def build_input_embedding(cls, args, dictionary):
        """fairseq's choice of input embedding (plain or adaptive), with cutoffs parsed, not eval'd."""
        if args.adaptive_input:
            return AdaptiveInput(
                len(dictionary),
                dictionary.pad(),
                args.decoder_input_dim,
                args.adaptive_input_factor,
                args.decoder_embed_dim,
                parse_cutoffs(args.adaptive_input_cutoff, "adaptive_input_cutoff"),
                args.quant_noise_pq,
                args.quant_noise_pq_block_size,
            )
        return Embedding(len(dictionary), args.decoder_input_dim, dictionary.pad())


# --- presets: each the fairseq transformer_lm preset of the same suffix ---------------


def resi_dual_lm_defaults(args):
    """The dataclass defaults of ``resi_dual_lm`` (= fairseq's ``transformer_lm``), as a preset."""
    args.dual_scale_decoder = safe_getattr(args, "dual_scale_decoder", 1.0)
    args.main_alpha_decoder = safe_getattr(args, "main_alpha_decoder", 1.0)


# Suffixes of fairseq's transformer_lm presets mirrored here (all of them but the
# aliases; ``resi_dual_lm`` itself mirrors ``transformer_lm``). What the user chose for
# the two scheme options survives fairseq's preset, which forces Pre-LN and (wiki103)
# no final norm: build_model refuses either.
PRESET_SUFFIXES = (
    "big", "wiki103", "gbw", "gpt", "gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_big",
    "gpt3_small", "gpt3_medium", "gpt3_large", "gpt3_xl",
)
PRESETS = register_presets(
    "resi_dual_lm", resi_dual_lm_defaults,
    presets={suffix: ARCH_CONFIG_REGISTRY[f"transformer_lm_{suffix}"] for suffix in PRESET_SUFFIXES},
    keep=("decoder_normalize_before", "no_decoder_final_norm"),
)

# fairseq architecture each ResiDual LM architecture mirrors (used by docs and tests).
FAIRSEQ_PRESET_OF = fairseq_preset_of("resi_dual_lm", ("",) + PRESET_SUFFIXES, "transformer_lm")
