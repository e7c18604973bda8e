"""The models to analyse: fresh models of any variant, or trained checkpoints."""
import torch

from ..errors import UserError
from ..models.admin import profile_omegas
from ..checkpoints import WeightsMismatchError, load_models
from ..variants import VARIANTS, build_language_model, build_model, needs_profile

# Size options of the CLI -> fairseq model options they set on both stacks.
SIZE_OPTIONS = {
    "embed_dim": ("encoder_embed_dim", "decoder_embed_dim"),
    "ffn_dim": ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
    "heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "encoder_layers": ("encoder_layers",),
    "decoder_layers": ("decoder_layers",),
    "dropout": ("dropout",),
}


def model_overrides(**sizes) -> dict:
    """``model_overrides(embed_dim=64, encoder_layers=24)`` -> fairseq options; None = preset's."""
    overrides = {}
    for name, value in sizes.items():
        if name not in SIZE_OPTIONS:
            raise ValueError(f"unknown size option {name!r}")
        if value is not None:
            overrides.update({option: value for option in SIZE_OPTIONS[name]})
    return overrides


def fresh_model(variant, task, seed=1, preset="", dual_scale=None, profile_batches=None, **sizes):
    """A freshly initialised ``variant`` (fairseq's own init) for the task's dictionaries.

    The same seed gives the variants the same random stream, so they differ in the
    residual scheme, not in luck of the draw. Admin's omegas are profiled on
    ``profile_batches`` (as its training would start), or stay at 1 without them.
    """
    if variant not in VARIANTS:
        raise UserError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if not hasattr(task, "src_dict"):  # fairseq's language_modeling task
        return fresh_language_model(variant, task, seed, preset, dual_scale, **sizes)
    overrides = model_overrides(**sizes)
    if variant == "resi_dual" and dual_scale is not None:
        overrides.update(dual_scale_encoder=dual_scale, dual_scale_decoder=dual_scale)
    torch.manual_seed(seed)
    try:
        model = build_model(variant, preset, task.source_dictionary, task.target_dictionary, **overrides)
    except KeyError as err:
        raise UserError(f"unknown preset {preset!r}") from err
    if needs_profile(variant) and profile_batches:
        profile_omegas(model, list(profile_batches), seed=seed)
    return model


# Size options of the CLI -> the options they set on a decoder-only language model.
LM_SIZE_OPTIONS = {
    "embed_dim": ("decoder_embed_dim", "decoder_input_dim", "decoder_output_dim"),
    "ffn_dim": ("decoder_ffn_embed_dim",),
    "heads": ("decoder_attention_heads",),
    "decoder_layers": ("decoder_layers",),
    "dropout": ("dropout",),
}


def fresh_language_model(variant, task, seed=1, preset="", dual_scale=None, **sizes):
    """A fresh Post-LN / Pre-LN (fairseq's transformer_lm) or resi_dual_lm, shared embeddings."""
    if preset:
        raise UserError("--preset applies to translation models; size a language model with "
                        "--embed-dim/--ffn-dim/--heads/--layers")
    overrides = {"share_decoder_input_output_embed": True, "tokens_per_sample": task.args.tokens_per_sample}
    for name, value in sizes.items():
        if value is not None and name in LM_SIZE_OPTIONS:
            overrides.update({option: value for option in LM_SIZE_OPTIONS[name]})
    if variant == "resi_dual" and dual_scale is not None:
        overrides["dual_scale_decoder"] = dual_scale
    torch.manual_seed(seed)
    return build_language_model(variant, task.source_dictionary, **overrides)


def load_checkpoint(path, task):
    """A trained model from a fairseq checkpoint, built for ``task``'s dictionaries
    (the file is read once and checked: :func:`~residual_fairseq.checkpoints.load_models`)."""
    try:
        models, _cfg, _task = load_models(path, task=task)
    except WeightsMismatchError as err:
        # Typically "size mismatch for encoder.embed_tokens.weight": other dictionaries.
        raise UserError(f"checkpoint {path} does not fit the data dir's dictionaries: {err.detail}") from None
    return models[0]
