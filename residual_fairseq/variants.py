"""Build the residual schemes' models side by side (translation; language models: LM_VARIANTS).

The variants differ only in the residual scheme: Post-LN and Pre-LN are fairseq's
own ``transformer`` (without/with ``normalize_before``); ResiDual, DeepNet, Admin and
B2T are this package's ``resi_dual``, ``deepnet``, ``admin`` and ``b2t``. Every size
option comes from the same fairseq preset. Used by the configs, the tools, the
diagnostics, the benchmarks and the tests.
"""
import argparse
from types import SimpleNamespace

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from . import models as _models  # noqa: F401  (registers resi_dual)

VARIANTS = ("post_ln", "pre_ln", "resi_dual", "deepnet", "admin", "b2t")
# The schemes that come as language models (fairseq's transformer_lm, and resi_dual_lm).
LM_VARIANTS = ("post_ln", "pre_ln", "resi_dual")

# Variant -> fairseq model (and architecture family) that implements it.
MODEL_OF = {"post_ln": "transformer", "pre_ln": "transformer", "resi_dual": "resi_dual",
            "deepnet": "deepnet", "admin": "admin", "b2t": "b2t"}

# One colour and display name per variant, shared by every plot of every tool.
COLOURS = {"post_ln": "tab:red", "pre_ln": "tab:blue", "resi_dual": "tab:green",
           "deepnet": "tab:purple", "admin": "tab:orange", "b2t": "tab:brown"}
DISPLAY_NAMES = {"post_ln": "Post-LN", "pre_ln": "Pre-LN", "resi_dual": "ResiDual",
                 "deepnet": "DeepNet", "admin": "Admin", "b2t": "B2T"}


def arch_name(variant: str, preset: str = "") -> str:
    """``arch_name("pre_ln", "iwslt_de_en") == "transformer_iwslt_de_en"``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    family = MODEL_OF[variant]
    return f"{family}_{preset}" if preset else family


def lm_arch_name(variant: str) -> str:
    """The language-model architecture of a variant: fairseq's ``transformer_lm`` (Post-LN
    by default, Pre-LN with ``decoder_normalize_before``) or ``resi_dual_lm``. Not fairseq's
    named ``transformer_lm_*`` presets: those force Pre-LN."""
    if variant not in LM_VARIANTS:
        raise ValueError(f"no {variant!r} language model; language models come as {', '.join(LM_VARIANTS)} "
                         f"(the deep-Transformer baselines are translation models)")
    return "resi_dual_lm" if variant == "resi_dual" else "transformer_lm"


def needs_profile(variant: str) -> bool:
    """Whether a new model of ``variant`` is initialised from a profiling pass (Admin)."""
    return variant == "admin"


def variant_overrides(variant: str) -> dict:
    """The options that make a variant, beyond its architecture name."""
    pre = variant == "pre_ln"
    return {"encoder_normalize_before": pre, "decoder_normalize_before": pre}


def toy_dictionary(num_symbols: int = 100) -> Dictionary:
    d = Dictionary()
    for i in range(num_symbols):
        d.add_symbol(f"tok{i}")
    d.finalize(padding_factor=8)
    return d


def build_language_model(variant: str, dictionary=None, **overrides):
    """Build a freshly initialised language model of ``variant`` (options as in build_model,
    e.g. ``decoder_layers=24, decoder_embed_dim=64``; they win over the defaults)."""
    from fairseq.models import MODEL_DATACLASS_REGISTRY
    from fairseq.dataclass.utils import merge_with_parent
    from omegaconf import OmegaConf

    arch = lm_arch_name(variant)
    dictionary = dictionary if dictionary is not None else toy_dictionary()
    width = overrides.get("decoder_embed_dim", 512)  # the dataclass would keep 512 for these two
    values = {"decoder_normalize_before": variant == "pre_ln", "tokens_per_sample": 512,
              "decoder_input_dim": width, "decoder_output_dim": width,
              "add_bos_token": False, "max_target_positions": None, "tpu": False, **overrides}
    cfg = merge_with_parent(MODEL_DATACLASS_REGISTRY[arch](), OmegaConf.create(values))
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return ARCH_MODEL_REGISTRY[arch].build_model(cfg, task)


def build_model(variant: str, preset: str = "", src_dict=None, tgt_dict=None, **overrides):
    """Build a freshly initialised encoder-decoder of ``variant``.

    ``overrides`` are fairseq model options by their argparse names, e.g.
    ``encoder_layers=24, encoder_embed_dim=64``; they win over the preset.
    """
    arch = arch_name(variant, preset)
    src_dict = src_dict if src_dict is not None else toy_dictionary()
    tgt_dict = tgt_dict if tgt_dict is not None else src_dict
    args = argparse.Namespace(arch=arch, _name=arch, **{**variant_overrides(variant), **overrides})
    ARCH_CONFIG_REGISTRY[arch](args)
    task = SimpleNamespace(source_dictionary=src_dict, target_dictionary=tgt_dict)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
