"""The dual (Pre-LN style) residual stream of ResiDual, as values.

For every sublayer k of a stack, with F_k its output after dropout:

    main stream  x_{k+1} = LN_k(x_k + F_k(x_k))      (fairseq's Post-LN sublayers)
    dual stream  d_{k+1} = d_k + s * F_k(x_k),  d_0 = s * x_0
    output       y       = alpha * x_N + LN_final(d_N)      (alpha = 1 in the paper)

``d`` is an ordinary tensor that a stack creates from its input, hands to each
layer and gets back from it, like ``x``: one forward pass owns its ``d``, so
threads, nested passes, exceptions, LayerDrop (any layer may be skipped, all of
them included: then ``y = alpha * x_0 + LN(s * x_0)``), activation checkpointing
(a recomputed layer returns its ``d`` again) and TorchScript all just work.

Why the final norm's eps is scaled by ``s^2``: ``d`` is ``s`` times the stream at
``s = 1``, and ``LN_eps(s * v) = LN_{eps / s^2}(v)``. With ``eps = FINAL_NORM_EPS *
s^2`` the output is the same for every ``s`` (up to float rounding), and ``s`` changes
only the range of ``d``. ``FINAL_NORM_EPS`` is 1e-7, the value of the paper's
authors' final norm, so that a converted checkpoint of theirs computes what it
computed there.
"""
from typing import List

import torch
from torch import Tensor

from fairseq.modules import LayerNorm

FINAL_NORM_EPS = 1e-7


def final_norm(embed_dim: int, scale: float, export: bool = False):
    """``LN_final``, its eps scaled so that the output does not depend on ``s``."""
    return LayerNorm(embed_dim, eps=FINAL_NORM_EPS * scale * scale, export=export)


def start(x0: Tensor, scale: float) -> Tensor:
    """``d_0 = s * x_0``; always a new tensor, never an alias of ``x_0``."""
    return x0 * scale


def accumulate(d: Tensor, sublayer_outputs: List[Tensor], scale: float, in_place: bool) -> Tensor:
    """``d + s * sum_k F_k``, one fused add per sublayer.

    ``in_place`` is for inference only (no autograd, nothing else holds ``d``): each
    beam-search step then updates ``d`` without allocating a new tensor.
    """
    for out in sublayer_outputs:
        if in_place:
            d = d.add_(out, alpha=scale)
        else:
            d = torch.add(d, out, alpha=scale)
    return d


def output(x: Tensor, normalised_d: Tensor, alpha: float) -> Tensor:
    """``y = alpha * x_N + LN_final(d_N)``, given ``LN_final(d_N)``."""
    if alpha != 1.0:
        x = x * alpha
    return x + normalised_d
