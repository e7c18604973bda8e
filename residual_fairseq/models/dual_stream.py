"""The dual (Pre-LN style) residual stream of ResiDual: the formula, and its steps as values.

A stack (the encoder, or the decoder) of N sublayers, k = 0..N-1 in the order they
run (self-attention, [cross-attention,] FFN of layer 1, then layer 2...), x_0 the
stack's input (embeddings after dropout), F_k a sublayer's output after dropout::

    (1)  d_0     = s * x_0                          start()
    (2)  x_{k+1} = LN_k(x_k + F_k(x_k))             fairseq's Post-LN sublayer
         d_{k+1} = d_k + s * F_k(x_k)               accumulate()
    (3)  y       = alpha * x_N + LN_final(d_N)      output(x_N, LN_final(d_N), alpha)

``s`` is ``--dual-scale-encoder/decoder`` (the authors' ``enc/dec_res_input_norm_scale``),
``alpha`` is ``--main-alpha-encoder/decoder`` (``enc/dec_alpha``; the paper: 1), and
LN_final is :func:`final_norm` (eps 1e-7 * s^2, see below). Where each step runs:

- (1) and (3): ``ResiDualEncoder.forward_scriptable`` and
  ``ResiDualDecoder.extract_features_scriptable`` (resi_dual.py), fairseq's layer
  loops with these lines added (marked ``# ResiDual: eq. (1)`` / ``eq. (3)``);
  (3) takes the place of fairseq's optional final norm, under its name ``layer_norm``.
- (2): ``ResiDualEncoderLayer.forward`` / ``ResiDualDecoderLayer.forward``
  (resi_dual.py): ``PostLN*Layer.sublayers`` (postln_layers.py) computes the
  ``x`` line, with ``combine`` = ``x_k + F_k``, and returns every ``F_k``;
  :func:`accumulate` adds them to ``d``.

``d`` is an ordinary tensor that a stack creates from its input, hands to each
layer and gets back from it, like ``x``: one forward pass owns its ``d``, so
threads, nested passes, exceptions, LayerDrop (any layer may be skipped, all of
them included: then ``y = alpha * x_0 + LN(s * x_0)``), activation checkpointing
(a recomputed layer returns its ``d`` again) and TorchScript all just work.

Why the final norm's eps is scaled by ``s^2``: ``d`` is ``s`` times the stream at
``s = 1``, and ``LN_eps(s * v) = LN_{eps / s^2}(v)``. With ``eps = FINAL_NORM_EPS *
s^2`` the output is the same for every ``s`` (up to float rounding), and ``s`` changes
only the range of ``d``. ``FINAL_NORM_EPS`` is 1e-7, the eps of the paper's
authors' final norm; theirs stays 1e-7 for every ``s``, so a converted checkpoint of
theirs computes exactly what it computed there at ``s = 1``, and differs by up to
~3e-6 in log-probs at ``s != 1`` (their s = 0.05; docs/conversion.md).
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
