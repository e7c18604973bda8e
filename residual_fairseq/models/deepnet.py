"""DeepNet / DeepNorm (Wang et al. 2022, arXiv 2203.00555), registered as fairseq model ``deepnet``.

Every sublayer, ``F`` its output after dropout::

    x_{l+1} = LN(alpha * x_l + F(x_l))

and at initialisation the value projection, the attention output projection and both
FFN weights are xavier-normal with gain ``beta``, queries and keys with gain 1. For
an encoder-decoder of N encoder and M decoder layers (the paper's Table 1):

    encoder  alpha = 0.81 (N^4 M)^(1/16)   beta = 0.87 (N^4 M)^(-1/16)
    decoder  alpha = (3M)^(1/4)            beta = (12M)^(-1/4)

The constants follow from the depths, so ``--encoder-layers`` / ``--decoder-layers``
are the scheme's only options; fairseq's transformer supplies everything else.
Reference implementation: microsoft/torchscale (``deepnorm=True``).
"""
from typing import Tuple

from torch import Tensor, nn

from fairseq.models import register_model

from .postln_family import PostLNFamilyModel, fairseq_preset_of, register_presets, stacks_with
from .postln_layers import PostLNCombine, PostLNDecoderLayer, PostLNEncoderLayer


def encoder_constants(encoder_layers: int, decoder_layers: int) -> Tuple[float, float]:
    """(alpha, beta) of the encoder of an N-encoder, M-decoder-layer model."""
    depth = (encoder_layers ** 4 * decoder_layers) ** (1 / 16)
    return 0.81 * depth, 0.87 / depth


def decoder_constants(decoder_layers: int) -> Tuple[float, float]:
    """(alpha, beta) of the decoder of an M-decoder-layer encoder-decoder."""
    return (3 * decoder_layers) ** (1 / 4), (12 * decoder_layers) ** (-1 / 4)


def deepnorm_init(attentions, linears, beta: float) -> None:
    """xavier-normal: gain beta for values, attention outputs and FFN; 1 for queries and keys."""
    for attention in attentions:
        nn.init.xavier_normal_(attention.q_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attention.k_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attention.v_proj.weight, gain=beta)
        nn.init.xavier_normal_(attention.out_proj.weight, gain=beta)
    for linear in linears:
        nn.init.xavier_normal_(linear.weight, gain=beta)


class DeepNormCombine(PostLNCombine):
    def combine(self, sublayer: int, out: Tensor, residual: Tensor, layer_input: Tensor) -> Tensor:
        return residual * self.alpha + out

    def extra_repr(self) -> str:
        # Printed in fairseq's training log, so the constants in use are visible there.
        return f"alpha={self.alpha:.6g}, beta={self.beta:.6g}"


class DeepNetEncoderLayer(DeepNormCombine, PostLNEncoderLayer):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.alpha, self.beta = encoder_constants(cfg.encoder.layers, cfg.decoder.layers)
        deepnorm_init([self.self_attn], [self.fc1, self.fc2], self.beta)


class DeepNetDecoderLayer(DeepNormCombine, PostLNDecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        self.alpha, self.beta = decoder_constants(cfg.decoder.layers)
        attentions = [self.self_attn] + ([self.encoder_attn] if self.encoder_attn is not None else [])
        deepnorm_init(attentions, [self.fc1, self.fc2], self.beta)


DeepNetEncoder, DeepNetDecoder = stacks_with(DeepNetEncoderLayer, DeepNetDecoderLayer, "DeepNet")


@register_model("deepnet")
class DeepNetModel(PostLNFamilyModel):
    """Post-LN with DeepNorm: the residual up-weighted by alpha, sublayers initialised down by beta."""

    scheme = "deepnet"
    encoder_class = DeepNetEncoder
    decoder_class = DeepNetDecoder

    @classmethod
    def base_architecture(cls, args):
        deepnet_base(args)


ARCHITECTURES = register_presets("deepnet")
deepnet_base = ARCHITECTURES["deepnet"]
FAIRSEQ_PRESET_OF = fairseq_preset_of("deepnet")
