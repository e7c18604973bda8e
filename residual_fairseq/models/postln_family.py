"""What every residual scheme's encoder-decoder of this package shares: the model base and presets.

DeepNet, Admin and B2T change only the sum a sublayer's norm normalises
(:meth:`~.postln_layers.PostLNCombine.combine`), so each is fairseq's
transformer with its layers swapped: fairseq's own ``TransformerEncoderBase`` /
``TransformerDecoderBase`` run the layer loop (:func:`stacks_with`). ResiDual also
hands a second stream from layer to layer, so its stacks own the loop (resi_dual.py);
its model is a :class:`PostLNFamilyModel` like the others.

:class:`PostLNFamilyModel` overrides only ``add_args`` (number checks while parsing),
``build_model`` and ``build_encoder`` / ``build_decoder``. Registration is the legacy
one (``--arch X`` on the flat command line, as fairseq's ``transformer_legacy.py``),
and ``build_model`` converts the options with the scheme's own config dataclass,
skipping ``TransformerModel.build_model``, which would convert them to a plain
``TransformerConfig`` and drop a scheme's fields on the ``fairseq-hydra-train`` path.
Each scheme gets the six presets of :data:`PRESETS` (:func:`register_presets`), the
sizes of fairseq's ``transformer_X``; :func:`fairseq_preset_of` names them.
"""
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model_architecture
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    DEFAULT_MIN_PARAMS_TO_WRAP,
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    TransformerModelBase,
)
from fairseq.models.transformer import transformer_legacy as fairseq_presets
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.utils import safe_getattr
from omegaconf import OmegaConf

from ..argtypes import layer_count
from .postln_layers import ModelConfigError, refuse_unsupported_options

# Preset suffix -> fairseq's preset function of the same sizes ("" is the base).
PRESETS = {
    "": fairseq_presets.base_architecture,
    "tiny": fairseq_presets.tiny_architecture,
    "iwslt_de_en": fairseq_presets.transformer_iwslt_de_en,
    "wmt_en_de": fairseq_presets.transformer_wmt_en_de,
    "vaswani_wmt_en_de_big": fairseq_presets.transformer_vaswani_wmt_en_de_big,
    "wmt_en_de_big": fairseq_presets.transformer_wmt_en_de_big,
}


def preset_name(family: str, suffix: str) -> str:
    return f"{family}_{suffix}" if suffix else family


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def stacks_with(encoder_layer_class, decoder_layer_class, name: str):
    """fairseq's encoder and decoder stacks, building the given layer classes.

    The layer classes take ``(cfg, ...)`` like fairseq's layers; ``cfg`` is the
    whole model config, so a layer can read both depths (DeepNet's constants).
    """

    class Encoder(TransformerEncoderBase):
        def build_encoder_layer(self, cfg):
            return wrap_layer(encoder_layer_class(cfg, return_fc=self.return_fc), cfg)

    class Decoder(TransformerDecoderBase):
        def build_decoder_layer(self, cfg, no_encoder_attn=False):
            return wrap_layer(decoder_layer_class(cfg, no_encoder_attn), cfg)

    Encoder.__name__ = Encoder.__qualname__ = f"{name}Encoder"
    Decoder.__name__ = Decoder.__qualname__ = f"{name}Decoder"
    return Encoder, Decoder


def set_option_types(parser, types: dict) -> None:
    """Give the options ``types`` names (by dest) their value parser, so that a bad value
    is one argparse error line while the command line is parsed."""
    for action in getattr(parser, "_group_actions", parser._actions):
        action.type = types.get(action.dest, action.type)


def refuse_nested_normalize_before(args, scheme: str, why: str = "") -> None:
    """A hydra config's ``model.encoder.normalize_before: true``: one line naming the
    override that builds the model (``why``: where such a config comes from)."""
    if not OmegaConf.is_config(args):
        return
    sides = [side for side in ("encoder", "decoder")
             if OmegaConf.is_config(args.get(side)) and args.get(side).get("normalize_before")]
    if sides:
        names = " and ".join(f"model.{side}.normalize_before" for side in sides)
        raise ModelConfigError(
            f"{names} {'is' if len(sides) == 1 else 'are'} true, which does not apply to {scheme}: "
            f"override with {' '.join(f'model.{side}.normalize_before=false' for side in sides)}{why}"
        )


def check_layer_counts(cfg) -> None:
    """The model-level check of the layer counts (a config that did not come through argparse)."""
    for side in ("encoder", "decoder"):
        if getattr(cfg, side).layers < 1:
            raise ModelConfigError(f"--{side}-layers must be at least 1, got {getattr(cfg, side).layers}")


class PostLNFamilyModel(TransformerModel):
    """fairseq's transformer with a scheme's layers; subclasses set the class attributes."""

    config_class = TransformerConfig  # the scheme's config dataclass
    scheme = ""                       # its name in error messages
    scheme_note = "its layers are Post-LN"  # why normalize_before does not apply
    nested_normalize_before_note = ""  # where a config with model.encoder.normalize_before comes from
    encoder_class = TransformerEncoderBase
    decoder_class = TransformerDecoderBase
    option_types = {"encoder_layers": layer_count, "decoder_layers": layer_count}

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        # No defaults here, so that the architecture presets can fill them in.
        gen_parser_from_dataclass(parser, cls.config_class(), delete_default=True, with_prefix="")
        set_option_types(parser, cls.option_types)

    @classmethod
    def base_architecture(cls, args):
        """The scheme's base preset (fills every option the command line left unset)."""
        raise NotImplementedError

    @classmethod
    def validate(cls, cfg) -> None:
        """Reject options that contradict the scheme's formula."""
        refuse_unsupported_options(cfg, f"{cls.scheme} ({cls.scheme_note})")
        check_layer_counts(cfg)

    @classmethod
    def build_model(cls, args, task):
        refuse_nested_normalize_before(args, f"{cls.scheme} ({cls.scheme_note})", cls.nested_normalize_before_note)
        cls.base_architecture(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if not args.share_all_embeddings:
            args.min_params_to_wrap = getattr(args, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP)
        cfg = cls.config_class.from_namespace(args)
        cls.validate(cfg)
        model = TransformerModelBase.build_model.__func__(cls, cfg, task)
        cls.after_build(model, cfg)
        return model

    @classmethod
    def after_build(cls, model, cfg) -> None:
        """Hook for what a scheme does once the whole model exists (Admin's omegas)."""

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return cls.encoder_class(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return cls.decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def register_presets(model_name: str, scheme_defaults=None, presets=PRESETS, keep=()) -> dict:
    """Register ``<model_name>[_<suffix>]`` for every preset; returns {arch name: function}.

    ``presets`` maps a suffix to fairseq's preset function of those sizes.
    ``scheme_defaults(args)`` fills the scheme's own options before the sizes; the
    options named in ``keep`` keep the user's value (False when unset) over the preset's.
    """
    registered = {}
    for suffix, fairseq_preset in presets.items():
        arch = preset_name(model_name, suffix)

        def preset(args, fairseq_preset=fairseq_preset):
            kept = {name: safe_getattr(args, name, False) for name in keep}
            if scheme_defaults is not None:
                scheme_defaults(args)
            fairseq_preset(args)
            for name, value in kept.items():
                setattr(args, name, value)

        preset.__name__ = arch
        registered[arch] = register_model_architecture(model_name, arch)(preset)
    return registered


def fairseq_preset_of(model_name: str, suffixes=PRESETS, fairseq_model: str = "transformer") -> dict:
    """{our arch name: fairseq's arch of the same sizes}, for docs, tests and convert."""
    return {preset_name(model_name, suffix): preset_name(fairseq_model, suffix) for suffix in suffixes}
