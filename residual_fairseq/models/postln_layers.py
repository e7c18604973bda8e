"""fairseq's Post-LN transformer layers, with the residual adds open to a scheme.

Every residual scheme of this package (ResiDual, and the Post-LN family of deep
baselines) keeps fairseq's sublayers -- attention, cross-attention, FFN, their
dropouts and norms, the incremental state -- and changes only two things:

- the sum a sublayer's norm is applied to (Post-LN: ``residual + F``), which
  :meth:`combine` returns and a scheme may override;
- what a layer hands on besides ``x``: :meth:`sublayers` returns every sublayer
  output ``F_k`` (after dropout), so that a scheme can build a second stream from
  them *as values*, e.g. ResiDual's ``d``.

fairseq's own ``forward`` of these layers routes the adds through
``residual_connection(x, residual)``, which sees neither which sublayer it serves
nor the layer's input, and returns only ``x``; a scheme that needs either would
have to keep per-pass state on the module. So the forward is written out here,
once, for all schemes, Post-LN only (``normalize_before`` is refused by every
scheme's config check), and each subclass's ``forward`` is a few lines over
:meth:`sublayers`. The NormFormer extras of fairseq's layer (``--scale-attn``,
``--scale-fc``, ``--scale-heads``, ``--scale-resids``) and
``--cross-self-attention`` are not part of these schemes and are refused by
:func:`refuse_unsupported_options`.
"""
from typing import Dict, Final, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ..errors import UserError

# Sublayer indices, the same in encoder and decoder (an encoder has no CROSS_ATTN).
# Also class constants of the layers below, where TorchScript can read them.
SELF_ATTN = 0
CROSS_ATTN = 1
FFN = 2


class PostLNCombine:
    """The sublayer indices (as TorchScript-readable constants) and Post-LN's :meth:`combine`.

    A scheme whose encoder and decoder layers combine alike writes one such class and
    puts it first in both layers' bases (see b2t.py, deepnet.py).
    """

    SELF_ATTN: Final[int] = SELF_ATTN
    CROSS_ATTN: Final[int] = CROSS_ATTN
    FFN: Final[int] = FFN

    def combine(self, sublayer: int, out: Tensor, residual: Tensor, layer_input: Tensor) -> Tensor:
        """The sum that the sublayer's norm normalises (Post-LN: ``residual + F``)."""
        return residual + out


class ModelConfigError(UserError, ValueError):
    """A model option that the chosen residual scheme cannot honour."""


def refuse_unsupported_options(cfg, scheme: str) -> None:
    """Refuse fairseq options the written-out Post-LN layers do not implement."""
    for side in ("encoder", "decoder"):
        if getattr(cfg, side).normalize_before:
            raise ModelConfigError(
                f"--{side}-normalize-before does not apply to {scheme}: its layers are Post-LN"
            )
    unsupported = {
        "scale_attn": "--scale-attn", "scale_fc": "--scale-fc", "scale_heads": "--scale-heads",
        "scale_resids": "--scale-resids", "cross_self_attention": "--cross-self-attention",
    }
    for name, flag in unsupported.items():
        if getattr(cfg, name, False):
            raise ModelConfigError(f"{flag} is not supported by {scheme}")


def _attention_mask(attn_mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    # As fairseq: a 1 in the mask becomes a large negative number (not -inf, which
    # can make the softmax of a fully masked padded query NaN).
    if attn_mask is None:
        return None
    return attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)


class PostLNEncoderLayer(PostLNCombine, TransformerEncoderLayerBase):
    """fairseq's encoder layer, Post-LN, with :meth:`combine` and :meth:`sublayers` open."""

    def sublayers(
        self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, List[Tensor], Tensor]:
        """Run the layer: ``(x_out, [F_self_attn, F_ffn], fc_result)``."""
        layer_input = x
        out, _ = self.self_attn(
            query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
            need_weights=False, attn_mask=_attention_mask(attn_mask, x),
        )
        attn_out = self.dropout_module(out)
        x = self.self_attn_layer_norm(self.combine(self.SELF_ATTN, attn_out, x, layer_input))

        fc_result = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        ffn_out = self.dropout_module(fc_result)
        x = self.final_layer_norm(self.combine(self.FFN, ffn_out, x, layer_input))
        return x, [attn_out, ffn_out], fc_result

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        # fairseq's signature and return value, so fairseq's stack loop can call it.
        x, _, fc_result = self.sublayers(x, encoder_padding_mask, attn_mask)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x


class PostLNDecoderLayer(PostLNCombine, TransformerDecoderLayerBase):
    """fairseq's decoder layer, Post-LN, with :meth:`combine` and :meth:`sublayers` open."""

    def sublayers(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, List[Tensor], Optional[Tensor]]:
        """Run the layer: ``(x_out, [F_k for each sublayer that ran], cross-attention weights)``."""
        if need_head_weights:
            need_attn = True
        layer_input = x
        outs: List[Tensor] = []

        if prev_self_attn_state is not None:
            saved_state: Dict[str, Optional[Tensor]] = {
                "prev_key": prev_self_attn_state[0], "prev_value": prev_self_attn_state[1],
            }
            if len(prev_self_attn_state) >= 3:
                saved_state["prev_key_padding_mask"] = prev_self_attn_state[2]
            assert incremental_state is not None
            self.self_attn._set_input_buffer(incremental_state, saved_state)
        out, _ = self.self_attn(
            query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
        )
        out = self.dropout_module(out)
        outs.append(out)
        x = self.self_attn_layer_norm(self.combine(self.SELF_ATTN, out, x, layer_input))

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            if prev_attn_state is not None:
                saved_state: Dict[str, Optional[Tensor]] = {
                    "prev_key": prev_attn_state[0], "prev_value": prev_attn_state[1],
                }
                if len(prev_attn_state) >= 3:
                    saved_state["prev_key_padding_mask"] = prev_attn_state[2]
                assert incremental_state is not None
                self.encoder_attn._set_input_buffer(incremental_state, saved_state)
            out, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )
            out = self.dropout_module(out)
            outs.append(out)
            x = self.encoder_attn_layer_norm(self.combine(self.CROSS_ATTN, out, x, layer_input))

        out = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        out = self.dropout_module(out)
        outs.append(out)
        x = self.final_layer_norm(self.combine(self.FFN, out, x, layer_input))
        return x, outs, attn

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        # fairseq's signature and return value, so fairseq's stack loop can call it.
        x, _, attn = self.sublayers(
            x, encoder_out, encoder_padding_mask, incremental_state, prev_self_attn_state,
            prev_attn_state, self_attn_mask, self_attn_padding_mask, need_attn, need_head_weights,
        )
        return x, attn, None
