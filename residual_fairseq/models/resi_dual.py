"""The ResiDual encoder-decoder, registered as fairseq model ``resi_dual``.

The formula, and where each of its steps is in the code, is :mod:`.dual_stream`'s
docstring. Everything but the residual scheme is fairseq's transformer: embeddings,
positions, masks, attention, incremental state, output projection and embedding
sharing come from the fairseq parents of the classes below. The overrides:

- layers: fairseq's Post-LN sublayers (:mod:`.postln_layers`); a ResiDual layer
  takes ``(x, d)`` and returns ``(x, d)``, adding ``s * F_k`` of each of its
  sublayers to ``d``;
- stacks: the layer loop, so that ``d`` travels as a value from layer to layer and
  the output is ``alpha * x_N + LN_final(d_N)``. fairseq's loop passes only ``x``
  between layers and offers no narrower hook, so :class:`ResiDualEncoder` and
  :class:`ResiDualDecoder` own ``forward_scriptable`` / ``extract_features_scriptable``:
  fairseq 0.12.3's lines, each line that differs marked ``# ResiDual:``
  (tests/test_formula.py checks that against the installed fairseq);
- model: a :class:`~.postln_family.PostLNFamilyModel` like the deep Post-LN
  baselines, with a config dataclass holding the dual-stream options. The option
  names of the paper's authors' implementation are accepted as aliases; giving both
  names of one option with different values is refused, on the command line and in
  a config.
"""
import argparse
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase

from ..argtypes import is_finite_number, positive_number
from . import dual_stream
from .postln_family import (
    PostLNFamilyModel,
    fairseq_preset_of,
    register_presets,
    set_option_types,
    wrap_layer,
)
from .postln_layers import ModelConfigError, PostLNDecoderLayer, PostLNEncoderLayer


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


def check_dual_stream_option(name: str, value) -> float:
    """The model-level check of ``s`` and ``alpha`` (translation and language model)."""
    if not is_finite_number(value) or value <= 0:
        raise ModelConfigError(f"--{name.replace('_', '-')} must be a finite positive number, got {value!r}")
    low, high = DUAL_STREAM_RANGE
    if not low <= value <= high:
        raise ModelConfigError(f"--{name.replace('_', '-')} must be from {low:g} to {high:g}, got {value!r}")
    return float(value)


# --- layers: eq. (2) of dual_stream.py ------------------------------------------------------


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


# --- stacks: eqs. (1) and (3) of dual_stream.py, in the layer loops ----------------------------


class ResiDualStack:
    """What the encoder and the decoder share: LN_final, the settings, old checkpoints."""

    def set_dual_stream(self, embed_dim: int, scale, alpha, export: bool) -> None:
        self.dual_scale = float(scale)
        self.main_alpha = float(alpha)
        # LN_final of the dual stream, in the place (and under the state-dict name)
        # of fairseq's optional final norm.
        self.layer_norm = dual_stream.final_norm(embed_dim, self.dual_scale, export=export)

    def upgrade_state_dict_named(self, state_dict, name):
        # Checkpoints of release 0.1 kept LN_final one module deeper (layer_norm.norm.*).
        old = f"{name}.layer_norm.norm." if name else "layer_norm.norm."
        new = f"{name}.layer_norm." if name else "layer_norm."
        for key in [k for k in state_dict if k.startswith(old)]:
            state_dict[new + key[len(old):]] = state_dict.pop(key)
        return super().upgrade_state_dict_named(state_dict, name)

    def extra_repr(self) -> str:
        # Printed in fairseq's training log, so the settings in use are visible there.
        return f"dual_scale={self.dual_scale}, main_alpha={self.main_alpha}"


class ResiDualEncoder(ResiDualStack, TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.set_dual_stream(embed_tokens.embedding_dim, cfg.dual_scale_encoder, cfg.main_alpha_encoder, cfg.export)

    def build_encoder_layer(self, cfg):
        return wrap_layer(ResiDualEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    # fairseq 0.12.3 fairseq/models/transformer/transformer_encoder.py
    # TransformerEncoderBase.forward_scriptable, with d added (its docstring left out).
    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        # compute padding mask
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = (
            torch.tensor(src_tokens.device.type == "xla") or encoder_padding_mask.any()
        )
        # Torchscript doesn't handle bool Tensor correctly, so we need to work around.
        if torch.jit.is_scripting():
            has_pads = torch.tensor(1) if has_pads else torch.tensor(0)

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)

        # account for padding while computing the representation
        x = x * (
            1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x)
        )

        # B x T x C -> T x B x C
        x = x.transpose(0, 1)

        encoder_states = []
        fc_results = []

        if return_all_hiddens:
            encoder_states.append(x)

        dual = dual_stream.start(x, self.dual_scale)  # ResiDual: eq. (1), d_0 = s * x_0
        # encoder layers
        for layer in self.layers:
            x, dual = layer(  # ResiDual: eq. (2), a layer takes and returns (x, d)
                x, dual, encoder_padding_mask=encoder_padding_mask if has_pads else None  # ResiDual: d
            )
            # ResiDual: fairseq unpacks (x, fc_result) here; a ResiDual layer returns (x, d)

            if return_all_hiddens and not torch.jit.is_scripting():
                assert encoder_states is not None
                encoder_states.append(x)
                # ResiDual: fc_results stays [] (fairseq appends fc_result, None for these layers)

        x = dual_stream.output(x, self.layer_norm(dual), self.main_alpha)  # ResiDual: eq. (3), not x = LN(x)

        # The Pytorch Mobile lite interpreter does not supports returning NamedTuple in
        # `forward` so we use a dictionary instead.
        # TorchScript does not support mixed values so the values are all lists.
        # The empty list is equivalent to None.
        src_lengths = (
            src_tokens.ne(self.padding_idx)
            .sum(dim=1, dtype=torch.int32)
            .reshape(-1, 1)
            .contiguous()
        )
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": fc_results,  # List[T x B x C]
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class ResiDualDecoder(ResiDualStack, TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(
            cfg, dictionary, embed_tokens,
            no_encoder_attn=no_encoder_attn, output_projection=output_projection,
        )
        self.set_dual_stream(self.embed_dim, cfg.dual_scale_decoder, cfg.main_alpha_decoder, cfg.export)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(ResiDualDecoderLayer(cfg, no_encoder_attn), cfg)

    # fairseq 0.12.3 fairseq/models/transformer/transformer_decoder.py
    # TransformerDecoderBase.extract_features_scriptable, with d added (its docstring left out).
    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        bs, slen = prev_output_tokens.size()
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        # embed positions
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(
                prev_output_tokens, incremental_state=incremental_state
            )

        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]

        # Prevent torchscript exporting issue for dynamic quant embedding
        prev_output_tokens = prev_output_tokens.contiguous()
        # embed tokens and positions
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

        # B x T x C -> T x B x C
        x = x.transpose(0, 1)

        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        # decoder layers
        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        # ResiDual: d at a position depends only on that position's own sublayer outputs, so
        # ResiDual: incremental decoding needs no cache for it: each step starts from its x_0.
        dual = dual_stream.start(x, self.dual_scale)  # ResiDual: eq. (1), d_0 = s * x_0
        for idx, layer in enumerate(self.layers):
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(x)
            else:
                self_attn_mask = None

            x, dual, layer_attn = layer(  # ResiDual: eq. (2), a layer takes and returns (x, d)
                x,
                dual,  # ResiDual: d
                enc,
                padding_mask,
                incremental_state,
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

            # average probabilities over heads
            attn = attn.mean(dim=0)

        x = dual_stream.output(x, self.layer_norm(dual), self.main_alpha)  # ResiDual: eq. (3), not x = LN(x)

        # T x B x C -> B x T x C
        x = x.transpose(0, 1)

        if self.project_out_dim is not None:
            x = self.project_out_dim(x)

        return x, {"attn": [attn], "inner_states": inner_states}


# --- the model ----------------------------------------------------------------------------------


class _OneOfTwoNames(argparse.Action):
    """Stores an option that has two names (ours and the authors'): given under both names
    with different values, it is argparse's one ``error:`` line (exit 2), in either order.

    The authors' name stores under its own dest (absent unless given), which
    :func:`dual_stream_defaults` moves to ours once the command line is parsed."""

    def __init__(self, option_strings, dest, other_dest, other_flag, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.other_dest, self.other_flag = other_dest, other_flag

    def __call__(self, parser, namespace, values, option_string=None):
        other = getattr(namespace, self.other_dest, None)
        if other is not None and other != values:
            raise argparse.ArgumentError(
                self, f"{values:g} contradicts {self.other_flag} {other:g}, the other name of the "
                "same option: give one of them"
            )
        setattr(namespace, self.dest, values)


@register_model("resi_dual")
class ResiDualModel(PostLNFamilyModel):
    """ResiDual (Xie et al., 2023): Post-LN main stream plus a Pre-LN dual stream."""

    config_class = ResiDualConfig
    scheme = "resi_dual"
    scheme_note = "its main stream is Post-LN; its dual stream is the Pre-LN path"
    nested_normalize_before_note = (
        " (the paper's authors' yamls set it, and their layers never read it; "
        "a checkpoint of theirs converts with residual-fairseq-convert)"
    )
    encoder_class = ResiDualEncoder
    decoder_class = ResiDualDecoder
    option_types = {"encoder_layers": positive_number(int), "decoder_layers": positive_number(int)}

    @classmethod
    def add_args(cls, parser):
        # fairseq's transformer options (no defaults: the presets fill them in), then the
        # dual-stream options under both names.
        gen_parser_from_dataclass(parser, TransformerConfig(), delete_default=True, with_prefix="")
        set_option_types(parser, cls.option_types)
        for official, ours in OFFICIAL_OPTION_NAMES.items():
            ours_flag, official_flag = "--" + ours.replace("_", "-"), "--" + official.replace("_", "-")
            parser.add_argument(
                ours_flag, dest=ours, type=positive_number(float), action=_OneOfTwoNames,
                other_dest=official, other_flag=official_flag,
                help=ResiDualConfig.__dataclass_fields__[ours].metadata["help"],
            )
            parser.add_argument(
                official_flag, dest=official, type=positive_number(float), action=_OneOfTwoNames,
                other_dest=ours, other_flag=ours_flag, default=argparse.SUPPRESS,
                metavar="FLOAT", help=f"the paper's authors' name for {ours_flag}",
            )

    @classmethod
    def base_architecture(cls, args):
        resi_dual_base(args)

    @classmethod
    def validate(cls, cfg) -> None:
        super().validate(cfg)
        for name in DUAL_STREAM_OPTIONS:
            check_dual_stream_option(name, getattr(cfg, name))
        if cfg.no_decoder_final_norm:
            raise ModelConfigError(
                "--no-decoder-final-norm does not apply to resi_dual: LN(d_N) is part of its output"
            )


def dual_stream_defaults(args, options=DUAL_STREAM_OPTIONS):
    """Fill in the dual-stream options; take the authors' names where given.

    Runs on every path that builds a model (flat CLI, hydra config, a checkpoint's
    stored config), so an authors'-style config never silently trains with s = 1.
    On the flat command line the authors' name is then dropped, so that the stored
    options hold each value once, under our name.
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
        if isinstance(args, argparse.Namespace):
            delattr(args, official)
    for name in options:
        if getattr(args, name, None) is None:
            setattr(args, name, 1.0)


# Architectures: each is the fairseq transformer preset of the same suffix, so that
# swapping transformer_X for resi_dual_X compares like for like.
ARCHITECTURES = register_presets("resi_dual", dual_stream_defaults)
resi_dual_base = ARCHITECTURES["resi_dual"]
FAIRSEQ_PRESET_OF = fairseq_preset_of("resi_dual")
