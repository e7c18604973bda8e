"""The B2T connection (Takase et al. 2023, arXiv 2206.00330), registered as fairseq model ``b2t``.

Post-LN inside a layer, plus a bottom-to-top connection: the layer's input ``x`` is
added to the sum that the layer's *last* norm normalises. Encoder layer::

    h = LN(x + Attn(x))
    y = LN(h + FFN(h) + x)

decoder layer likewise over its three sublayers::

    h1 = LN(x + SelfAttn(x));  h2 = LN(h1 + CrossAttn(h1));  y = LN(h2 + FFN(h2) + x)

The extra term gives every layer an identity path around its norms (the gradient
reaches the bottom layers as in Pre-LN) while the output stays normalised as in
Post-LN. Nothing else differs from fairseq's Post-LN transformer; no new parameters.
Reference implementation: takase/b2t_connection (``--residual-bottom-to-top``).
"""
from torch import Tensor

from fairseq.models import register_model

from .postln_family import PostLNFamilyModel, fairseq_preset_of, register_presets, stacks_with
from .postln_layers import PostLNCombine, PostLNDecoderLayer, PostLNEncoderLayer


class B2TCombine(PostLNCombine):
    def combine(self, sublayer: int, out: Tensor, residual: Tensor, layer_input: Tensor) -> Tensor:
        if sublayer == self.FFN:  # the layer's last norm
            return residual + out + layer_input
        return residual + out


class B2TEncoderLayer(B2TCombine, PostLNEncoderLayer):
    pass


class B2TDecoderLayer(B2TCombine, PostLNDecoderLayer):
    pass


B2TEncoder, B2TDecoder = stacks_with(B2TEncoderLayer, B2TDecoderLayer, "B2T")


@register_model("b2t")
class B2TModel(PostLNFamilyModel):
    """Post-LN plus each layer's input added before the layer's last norm."""

    scheme = "b2t"
    encoder_class = B2TEncoder
    decoder_class = B2TDecoder

    @classmethod
    def base_architecture(cls, args):
        b2t_base(args)


ARCHITECTURES = register_presets("b2t")
b2t_base = ARCHITECTURES["b2t"]
FAIRSEQ_PRESET_OF = fairseq_preset_of("b2t")
