"""The dual (Pre-LN style) residual stream of ResiDual.

For every sublayer k of a stack, with F_k its output after dropout:

    main stream  x_{k+1} = LN_k(x_k + F_k(x_k))      (fairseq's Post-LN layer, unchanged)
    dual stream  d_{k+1} = d_k + s * F_k(x_k),  d_0 = s * x_0
    output       y       = x_N + LN_final(d_N)

fairseq's layers route every residual add through ``residual_connection(x, residual)``
and its stacks apply one optional final norm (``self.layer_norm``). ResiDual therefore
needs only a place to accumulate ``d`` while the layers run: :class:`DualStream`, one
per stack, shared by its layers, and read once by :class:`DualStreamOutput`, which
takes the place of the stack's final norm.
"""
from typing import Optional

import torch
from torch import Tensor, nn

from fairseq.modules import LayerNorm


class DualStream:
    """Accumulator for ``d`` during one forward pass of one stack.

    Plain state, not a module: it holds no parameters and nothing that outlives a
    pass. A pass starts at the first layer that runs (``enter_layer``) and ends when
    the output reads the stream (``take``); incremental decoding needs no cache for
    it, because ``d`` at a position depends only on that position's own sublayer
    outputs.
    """

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.value: Optional[Tensor] = None
        self._value_is_own = False  # False while d_0 may alias x_0
        self._last_layer = -1
        self._num_layers = 0

    def new_layer_index(self) -> int:
        """Called once per layer at build time; gives layers their position."""
        self._num_layers += 1
        return self._num_layers - 1

    def enter_layer(self, layer_index: int, x: Tensor) -> None:
        # A layer at or below the last one seen means a new pass has begun (the
        # previous one was abandoned, e.g. by an exception). The first layer that
        # runs sees x_0 as its input, also when LayerDrop skipped the layers before it.
        if self.value is None or layer_index <= self._last_layer:
            # At s = 1, d_0 is x_0 itself: no copy (add() never writes into it).
            self.value = x if self.scale == 1.0 else self.scale * x
            self._value_is_own = self.scale != 1.0
        self._last_layer = layer_index

    def add(self, sublayer_output: Tensor) -> None:
        if self._value_is_own and not torch.is_grad_enabled():
            # Inference (e.g. each beam-search step): accumulate in place rather
            # than allocate a new d per sublayer; nothing needs the old d.
            self.value.add_(sublayer_output, alpha=self.scale)
        else:
            # One fused op: ``d + s * F`` would first materialise s * F.
            self.value = torch.add(self.value, sublayer_output, alpha=self.scale)
            self._value_is_own = True

    def take(self) -> Tensor:
        if self.value is None:
            raise RuntimeError("ResiDual dual stream read before any layer ran")
        d, self.value = self.value, None
        self._last_layer = -1
        return d

    def reset(self) -> None:
        self.value = None
        self._last_layer = -1


class DualStreamOutput(nn.Module):
    """``y = x_N + LN_final(d_N)``: stands in for fairseq's final stack norm."""

    def __init__(self, embed_dim: int, stream: DualStream, export: bool = False):
        super().__init__()
        self.norm = LayerNorm(embed_dim, export=export)
        self.stream = stream

    def forward(self, x: Tensor) -> Tensor:
        d = self.stream.take()
        return x + self.norm(d)

    def extra_repr(self) -> str:
        # Printed in fairseq's training log, so the scale in use is visible there.
        return f"dual_scale={self.stream.scale}"


class DualStreamLayerMixin:
    """Makes a fairseq Post-LN layer also feed the dual stream of its stack.

    Mixed in before fairseq's layer class. The layer's own forward is fairseq's,
    untouched; only the residual add also records the sublayer output.
    """

    def attach_dual_stream(self, stream: DualStream) -> None:
        # A plain object, so nn.Module stores it as an attribute, not a submodule.
        self.dual_stream = stream
        self.layer_index = stream.new_layer_index()

    def forward(self, x: Tensor, *args, **kwargs):
        self.dual_stream.enter_layer(self.layer_index, x)
        try:
            return super().forward(x, *args, **kwargs)
        except BaseException:
            self.dual_stream.reset()
            raise

    def residual_connection(self, x: Tensor, residual: Tensor) -> Tensor:
        # x is F_k(x_k) after dropout; residual is x_k.
        self.dual_stream.add(x)
        return residual + x

