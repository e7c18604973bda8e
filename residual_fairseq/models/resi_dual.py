"""The ResiDual encoder-decoder, registered as fairseq model ``resi_dual``.

Everything but the residual scheme is fairseq's transformer: embeddings, positions,
masks, attention, incremental state, output projection and embedding sharing come
from the fairseq parents of the classes below. The overrides:

- layers: fairseq's Post-LN sublayers (:mod:`.postln_layers`); a ResiDual layer
  takes ``(x, d)`` and returns ``(x, d)``, adding ``s * F_k`` of each of its
  sublayers to ``d`` (:mod:`.dual_stream`);
- stacks: the layer loop, so that ``d`` travels as a value from layer to layer and
  the output is ``alpha * x_N + LN_final(d_N)``. fairseq's loop passes only ``x``
  between layers and offers no narrower hook, so :class:`ResiDualEncoder` and
  :class:`ResiDualDecoder` own ``forward_scriptable`` / ``extract_features_scriptable``:
  fairseq's code, the same steps in the same order, with ``d`` added;
- model: a config dataclass with the dual-stream options, registered the legacy way
  (as fairseq's ``transformer_legacy.py`` does) so that both ``fairseq-train --arch``
  and ``fairseq-hydra-train`` build it. The option names of the paper's authors'
  implementation are accepted as aliases.
"""
import argparse
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

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
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..argtypes import is_finite_number
from . import dual_stream
from .postln_layers import (
    ModelConfigError,
    PostLNDecoderLayer,
    PostLNEncoderLayer,
    refuse_unsupported_options,
)

@dataclass
class ResiDualConfig(TransformerConfig):
    # Named without an encoder_/decoder_ prefix on purpose: TransformerConfig routes
    # attributes with those prefixes into its nested encoder/decoder sub-configs.
    dual_scale_encoder: float = field(
        default=1.0,
        metadata={
            "help": "scale s of the encoder's dual stream (d_0 = s*x_0, d += s*F). s changes "
            "only the range of d (keep deep fp16/bf16 models inside half-precision range, "
            "e.g. 0.05), never the output"
        },
    )
    dual_scale_decoder: float = field(
        default=1.0,
        metadata={"help": "scale s of the decoder's dual stream (see dual_scale_encoder)"},
    )
    main_alpha_encoder: float = field(
        default=1.0,
        metadata={"help": "weight alpha of the main stream in the encoder's output "
                  "y = alpha * x_N + LN(d_N) (the paper: 1)"},
    )
    main_alpha_decoder: float = field(
        default=1.0,
        metadata={"help": "weight alpha of the main stream in the decoder's output (see main_alpha_encoder)"},
    )


# The option names of the paper's authors' fairseq implementation, and ours.
OFFICIAL_OPTION_NAMES = {
    "enc_res_input_norm_scale": "dual_scale_encoder",
    "dec_res_input_norm_scale": "dual_scale_decoder",
    "enc_alpha": "main_alpha_encoder",
    "dec_alpha": "main_alpha_decoder",
}
DUAL_STREAM_OPTIONS = tuple(OFFICIAL_OPTION_NAMES.values())


# s scales LN_final's epsilon by s^2 (1e-7 s^2 underflows float32 below s ~ 1e-19, and the output
# turns NaN); an alpha or s far from 1 overflows the scores long before that. No use of either
# (the paper: s = 0.05, alpha = 1) comes near these bounds.
DUAL_STREAM_RANGE = (1e-6, 1e6)


def _check_number(name: str, value) -> float:
    if not is_finite_number(value) or value <= 0:
        raise ModelConfigError(f"--{name.replace('_', '-')} must be a finite positive number, got {value!r}")
    low, high = DUAL_STREAM_RANGE
    if not low <= value <= high:
        raise ModelConfigError(f"--{name.replace('_', '-')} must be from {low:g} to {high:g}, got {value!r}")
    return float(value)


def validate(cfg: ResiDualConfig) -> None:
    """Reject options that contradict the ResiDual formula."""
    refuse_unsupported_options(cfg, "resi_dual (its main stream is Post-LN; its dual stream is the Pre-LN path)")
    for name in DUAL_STREAM_OPTIONS:
        _check_number(name, getattr(cfg, name))
    for side in ("encoder", "decoder"):
        if getattr(cfg, side).layers < 1:
            raise ModelConfigError(f"--{side}-layers must be at least 1, got {getattr(cfg, side).layers}")
    if cfg.no_decoder_final_norm:
        raise ModelConfigError(
            "--no-decoder-final-norm does not apply to resi_dual: LN(d_N) is part of its output"
        )


def _positive(number_type):
    def parse(text):
        try:
            value = number_type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
        return value

    parse.__name__ = f"positive {number_type.__name__}"
    return parse


def _in_place(training: bool) -> bool:
    # Accumulate d in place only where nothing can need the old d: inference
    # without autograd (each beam-search step). Not in training, where a
    # checkpointed layer runs under no_grad but keeps its input d for recomputation.
    return not training and not torch.is_grad_enabled()


class ResiDualEncoderLayer(PostLNEncoderLayer):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.dual_scale = float(cfg.dual_scale_encoder)

    def forward(
        self, x: Tensor, dual: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, Tensor]:
        x, outs, _ = self.sublayers(x, encoder_padding_mask, attn_mask)
        return x, dual_stream.accumulate(dual, outs, self.dual_scale, _in_place(self.training))


class ResiDualDecoderLayer(PostLNDecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        self.dual_scale = float(cfg.dual_scale_decoder)

    def forward(
        self,
        x: Tensor,
        dual: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        x, outs, attn = self.sublayers(
            x, encoder_out, encoder_padding_mask, incremental_state, None, None,
            self_attn_mask, self_attn_padding_mask, need_attn, need_head_weights,
        )
        return x, dual_stream.accumulate(dual, outs, self.dual_scale, _in_place(self.training)), attn


def carries_dual_stream(layer) -> bool:
    """Whether ``layer`` takes and returns ``(x, d)`` (for tools that hook layers)."""
    return isinstance(layer, (ResiDualEncoderLayer, ResiDualDecoderLayer))


def _wrap_layer(layer, cfg):
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # As fairseq: with FSDP, checkpointed layers are always wrapped.
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def _upgrade_final_norm_keys(state_dict, name: str) -> None:
    # Checkpoints of release 0.1 kept LN_final one module deeper (layer_norm.norm.*).
    old = f"{name}.layer_norm.norm." if name else "layer_norm.norm."
    new = f"{name}.layer_norm." if name else "layer_norm."
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[new + key[len(old):]] = state_dict.pop(key)


class ResiDualEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.dual_scale = float(cfg.dual_scale_encoder)
        self.main_alpha = float(cfg.main_alpha_encoder)
        # LN_final of the dual stream, in the place (and under the state-dict name)
        # of fairseq's optional final norm.
        self.layer_norm = dual_stream.final_norm(embed_tokens.embedding_dim, self.dual_scale, export=cfg.export)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(ResiDualEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        # fairseq's TransformerEncoderBase.forward_scriptable, with d carried beside x.
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = torch.tensor(src_tokens.device.type == "xla") or encoder_padding_mask.any()
        if torch.jit.is_scripting():
            has_pads = torch.tensor(1) if has_pads else torch.tensor(0)

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states: List[Tensor] = []
        if return_all_hiddens:
            encoder_states.append(x)
        dual = dual_stream.start(x, self.dual_scale)
        for layer in self.layers:  # LayerDrop may skip any of them, all included
            x, dual = layer(x, dual, encoder_padding_mask=encoder_padding_mask if has_pads else None)
            if return_all_hiddens and not torch.jit.is_scripting():
                encoder_states.append(x)
        x = dual_stream.output(x, self.layer_norm(dual), self.main_alpha)

        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }

    def upgrade_state_dict_named(self, state_dict, name):
        _upgrade_final_norm_keys(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def extra_repr(self) -> str:
        # Printed in fairseq's training log, so the settings in use are visible there.
        return f"dual_scale={self.dual_scale}, main_alpha={self.main_alpha}"


class ResiDualDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(
            cfg, dictionary, embed_tokens,
            no_encoder_attn=no_encoder_attn, output_projection=output_projection,
        )
        self.dual_scale = float(cfg.dual_scale_decoder)
        self.main_alpha = float(cfg.main_alpha_decoder)
        self.layer_norm = dual_stream.final_norm(self.embed_dim, self.dual_scale, export=cfg.export)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(ResiDualDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        # fairseq's TransformerDecoderBase.extract_features_scriptable, with d carried beside x.
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        prev_output_tokens = prev_output_tokens.contiguous()

        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        self_attn_padding_mask: Optional[Tensor] = None
        if prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        # d at a position depends only on that position's own sublayer outputs, so
        # incremental decoding needs no cache for it: each step starts from its x_0.
        dual = dual_stream.start(x, self.dual_scale)
        for idx, layer in enumerate(self.layers):  # LayerDrop may skip any of them, all included
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(x)
            else:
                self_attn_mask = None
            x, dual, layer_attn = layer(
                x, dual, enc, padding_mask, incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool((idx == alignment_layer)),
                need_head_weights=bool((idx == alignment_layer)),
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads

        x = dual_stream.output(x, self.layer_norm(dual), self.main_alpha)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def upgrade_state_dict_named(self, state_dict, name):
        _upgrade_final_norm_keys(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def extra_repr(self) -> str:
        # Printed in fairseq's training log, so the settings in use are visible there.
        return f"dual_scale={self.dual_scale}, main_alpha={self.main_alpha}"


@register_model("resi_dual")
class ResiDualModel(TransformerModel):
    """ResiDual (Xie et al., 2023): Post-LN main stream plus a Pre-LN dual stream.

    Built on fairseq's legacy ``TransformerModel`` so that ``--arch resi_dual_*``
    works on the flat command line; ``build_model`` converts its options with
    :class:`ResiDualConfig` so the dual-stream options also survive the hydra path.
    """

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        # No defaults here, so that the architecture presets below can fill them in.
        gen_parser_from_dataclass(parser, ResiDualConfig(), delete_default=True, with_prefix="")
        # Check numbers while parsing, so a bad value is one argparse error line.
        checks = {name: _positive(float) for name in DUAL_STREAM_OPTIONS}
        checks.update(encoder_layers=_positive(int), decoder_layers=_positive(int))
        for action in getattr(parser, "_group_actions", parser._actions):
            action.type = checks.get(action.dest, action.type)
        for official, ours in OFFICIAL_OPTION_NAMES.items():
            parser.add_argument(
                "--" + official.replace("_", "-"), dest=ours, type=_positive(float),
                metavar="FLOAT", help=f"the paper's authors' name for --{ours.replace('_', '-')}",
            )

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


def dual_stream_defaults(args, options=DUAL_STREAM_OPTIONS):
    """Fill in the dual-stream options; take the authors' names where given.

    Runs on every path that builds a model (flat CLI, hydra config, a checkpoint's
    stored config), so an authors'-style config never silently trains with s = 1.
    """
    for official, ours in OFFICIAL_OPTION_NAMES.items():
        if ours not in options:
            continue
        value = getattr(args, official, None)
        if value is None:
            continue
        current = getattr(args, ours, None)
        if current is not None and current != value:
            raise ModelConfigError(f"{official}={value} contradicts {ours}={current}; give one of them")
        setattr(args, ours, value)
    for name in options:
        if getattr(args, name, None) is None:
            setattr(args, name, 1.0)


def _register_preset(arch_name, fairseq_preset):
    @register_model_architecture("resi_dual", arch_name)
    def preset(args):
        dual_stream_defaults(args)
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
