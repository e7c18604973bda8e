"""The ResiDual encoder-decoder, registered as fairseq model ``resi_dual``.

Everything but the residual scheme is fairseq's transformer: embeddings, positions,
masks, attention, incremental state, output projection and embedding sharing all
come from the classes below's fairseq parents. The overrides are:

- layers: fairseq's Post-LN layers whose residual add also feeds the dual stream
  (:class:`~residual_fairseq.dual_stream.DualStreamLayerMixin`);
- stacks: ``build_*_layer`` builds those layers, and the stack's final norm becomes
  ``x_N + LN(d_N)`` (:class:`~residual_fairseq.dual_stream.DualStreamOutput`);
- model: a config dataclass with the dual-stream scales, registered the legacy way
  (as fairseq's ``transformer_legacy.py`` does) so that both ``fairseq-train --arch``
  and ``fairseq-hydra-train`` build it.
"""
import argparse
from dataclasses import dataclass, field

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
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
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .dual_stream import DualStream, DualStreamLayerMixin, DualStreamOutput
from ..errors import UserError


class ResiDualConfigError(UserError, ValueError):
    """A ResiDual model option that cannot be honoured."""


@dataclass
class ResiDualConfig(TransformerConfig):
    # Named without an encoder_/decoder_ prefix on purpose: TransformerConfig routes
    # attributes with those prefixes into its nested encoder/decoder sub-configs.
    dual_scale_encoder: float = field(
        default=1.0,
        metadata={
            "help": "scale s of the encoder's dual stream (d_0 = s*x_0, d += s*F); "
            "LN_final makes the output independent of s, so s < 1 only keeps d "
            "inside fp16 range in deep models"
        },
    )
    dual_scale_decoder: float = field(
        default=1.0,
        metadata={"help": "scale s of the decoder's dual stream (see dual_scale_encoder)"},
    )


def validate(cfg: ResiDualConfig) -> None:
    """Reject fairseq options that contradict the ResiDual formula."""
    for side in ("encoder", "decoder"):
        scale = getattr(cfg, f"dual_scale_{side}")
        if not scale > 0:
            raise ResiDualConfigError(
                f"--dual-scale-{side} must be a positive number, got {scale}"
            )
        if getattr(cfg, side).layers < 1:
            raise ResiDualConfigError(
                f"--{side}-layers must be at least 1, got {getattr(cfg, side).layers}"
            )
        if getattr(cfg, side).normalize_before:
            raise ResiDualConfigError(
                f"--{side}-normalize-before does not apply to resi_dual: its main "
                "stream is Post-LN and its dual stream is the Pre-LN path"
            )
    if cfg.checkpoint_activations or cfg.offload_activations:
        # Recomputing a layer in backward would not replay its adds to the dual
        # stream, so d would silently lose its gradient.
        raise ResiDualConfigError(
            "--checkpoint-activations/--offload-activations are not supported by resi_dual"
        )
    if cfg.no_decoder_final_norm:
        raise ResiDualConfigError(
            "--no-decoder-final-norm does not apply to resi_dual: LN(d_N) is part of its output"
        )


def _positive(number_type):
    def parse(text):
        value = number_type(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        return value

    parse.__name__ = f"positive {number_type.__name__}"
    return parse


class ResiDualEncoderLayer(DualStreamLayerMixin, TransformerEncoderLayerBase):
    pass


class ResiDualDecoderLayer(DualStreamLayerMixin, TransformerDecoderLayerBase):
    pass


class ResiDualEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        # The stream must exist before fairseq's __init__ builds the layers.
        self.dual_stream = DualStream(cfg.dual_scale_encoder)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.layer_norm = DualStreamOutput(
            embed_tokens.embedding_dim, self.dual_stream, export=cfg.export
        )

    def build_encoder_layer(self, cfg):
        layer = ResiDualEncoderLayer(cfg, return_fc=self.return_fc)
        layer.attach_dual_stream(self.dual_stream)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap)


class ResiDualDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.dual_stream = DualStream(cfg.dual_scale_decoder)
        super().__init__(
            cfg, dictionary, embed_tokens,
            no_encoder_attn=no_encoder_attn, output_projection=output_projection,
        )
        self.layer_norm = DualStreamOutput(self.embed_dim, self.dual_stream, export=cfg.export)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = ResiDualDecoderLayer(cfg, no_encoder_attn)
        layer.attach_dual_stream(self.dual_stream)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap)


@register_model("resi_dual")
class ResiDualModel(TransformerModel):
    """ResiDual (Xie et al., 2023): Post-LN main stream plus a Pre-LN dual stream.

    Built on fairseq's legacy ``TransformerModel`` so that ``--arch resi_dual_*``
    works on the flat command line; ``build_model`` converts its options with
    :class:`ResiDualConfig` so the dual-stream scales also survive the hydra path.
    """

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        # No defaults here, so that the architecture presets below can fill them in.
        gen_parser_from_dataclass(parser, ResiDualConfig(), delete_default=True, with_prefix="")
        # Check numbers while parsing, so a bad value is one argparse error line.
        checks = {
            "dual_scale_encoder": _positive(float), "dual_scale_decoder": _positive(float),
            "encoder_layers": _positive(int), "decoder_layers": _positive(int),
        }
        for action in getattr(parser, "_group_actions", parser._actions):
            action.type = checks.get(action.dest, action.type)

    @classmethod
    def build_model(cls, args, task):
        resi_dual_base(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if not args.share_all_embeddings:
            args.min_params_to_wrap = getattr(args, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP)
        cfg = ResiDualConfig.from_namespace(args)
        validate(cfg)
        # Skip TransformerModel.build_model: it would convert to a plain
        # TransformerConfig and drop the ResiDual fields of a hydra config.
        return TransformerModelBase.build_model.__func__(cls, cfg, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return ResiDualEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return ResiDualDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


# Architectures: each is the fairseq transformer preset of the same suffix, so that
# swapping transformer_X for resi_dual_X compares like for like.


def _dual_stream_defaults(args):
    args.dual_scale_encoder = getattr(args, "dual_scale_encoder", 1.0)
    args.dual_scale_decoder = getattr(args, "dual_scale_decoder", 1.0)


def _register_preset(arch_name, fairseq_preset):
    @register_model_architecture("resi_dual", arch_name)
    def preset(args):
        _dual_stream_defaults(args)
        fairseq_preset(args)

    preset.__name__ = arch_name
    return preset


resi_dual_base = _register_preset("resi_dual", fairseq_presets.base_architecture)
resi_dual_tiny = _register_preset("resi_dual_tiny", fairseq_presets.tiny_architecture)
resi_dual_iwslt_de_en = _register_preset("resi_dual_iwslt_de_en", fairseq_presets.transformer_iwslt_de_en)
resi_dual_wmt_en_de = _register_preset("resi_dual_wmt_en_de", fairseq_presets.transformer_wmt_en_de)
resi_dual_vaswani_wmt_en_de_big = _register_preset(
    "resi_dual_vaswani_wmt_en_de_big", fairseq_presets.transformer_vaswani_wmt_en_de_big
)
resi_dual_wmt_en_de_big = _register_preset("resi_dual_wmt_en_de_big", fairseq_presets.transformer_wmt_en_de_big)

# fairseq preset each ResiDual architecture mirrors (used by docs and tests).
FAIRSEQ_PRESET_OF = {
    "resi_dual": "transformer",
    "resi_dual_tiny": "transformer_tiny",
    "resi_dual_iwslt_de_en": "transformer_iwslt_de_en",
    "resi_dual_wmt_en_de": "transformer_wmt_en_de",
    "resi_dual_vaswani_wmt_en_de_big": "transformer_vaswani_wmt_en_de_big",
    "resi_dual_wmt_en_de_big": "transformer_wmt_en_de_big",
}
