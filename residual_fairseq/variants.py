"""Build Post-LN, Pre-LN and ResiDual translation models side by side.

The three variants differ only in the residual scheme: Post-LN and Pre-LN are
fairseq's own ``transformer`` (without/with ``normalize_before``), ResiDual is
``resi_dual``; every size option comes from the same fairseq preset. Used by the
diagnostics, the benchmarks and the tests, which need models without a data dir.
"""
import argparse
from types import SimpleNamespace

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from . import models as _models  # noqa: F401  (registers resi_dual)

VARIANTS = ("post_ln", "pre_ln", "resi_dual")


def arch_name(variant: str, preset: str = "") -> str:
    """``arch_name("pre_ln", "iwslt_de_en") == "transformer_iwslt_de_en"``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    family = "resi_dual" if variant == "resi_dual" else "transformer"
    return f"{family}_{preset}" if preset else family


def lm_arch_name(variant: str) -> str:
    """The language-model architecture of a variant: fairseq's ``transformer_lm`` (Post-LN
    by default, Pre-LN with ``decoder_normalize_before``) or ``resi_dual_lm``. Not fairseq's
    named ``transformer_lm_*`` presets: those force Pre-LN."""
    arch_name(variant)  # validates
    return "resi_dual_lm" if variant == "resi_dual" else "transformer_lm"


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
