"""The ResiDual formula written out independently of the plugin: the reference the model tests compare with.

The reference re-composes the model's own submodules (attention, FFN, norms)
by the equations, written out independently of the plugin's code path:

    x_{k+1} = LN_k(x_k + F_k(x_k));  d_{k+1} = d_k + s F_k(x_k);  d_0 = s x_0
    y = x_N + LN_final(d_N)
"""
import torch

SMALL = dict(
    encoder_embed_dim=32, encoder_ffn_embed_dim=48, encoder_attention_heads=4,
    decoder_embed_dim=32, decoder_ffn_embed_dim=48, decoder_attention_heads=4,
    encoder_layers=3, decoder_layers=3,
)


def ffn(layer, x):
    return layer.fc2(layer.activation_fn(layer.fc1(x)))


def reference_encoder(encoder, src_tokens, s, layers=None, drop_dual_term=None, final_norm_eps=None):
    """``layers``: the layers that run (LayerDrop); ``drop_dual_term``: a dual add to leave out;
    ``final_norm_eps``: LN_final's epsilon, if not the model's own."""
    pad = src_tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(src_tokens)
    x = (x * (~pad).unsqueeze(-1).type_as(x)).transpose(0, 1)
    d = s * x
    terms = 0
    for layer in encoder.layers if layers is None else layers:
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad)[0]
        terms += 1
        d, x = d + (0 if terms == drop_dual_term else s * f), layer.self_attn_layer_norm(x + f)
        f = ffn(layer, x)
        terms += 1
        d, x = d + (0 if terms == drop_dual_term else s * f), layer.final_layer_norm(x + f)
    if final_norm_eps is not None:
        norm = encoder.layer_norm
        return x + torch.nn.functional.layer_norm(d, d.shape[-1:], norm.weight, norm.bias, final_norm_eps)
    return x + encoder.layer_norm(d)


def reference_decoder_features(decoder, prev_tokens, enc_out, enc_pad, s, layers=None):
    t = prev_tokens.size(1)
    x = decoder.embed_scale * decoder.embed_tokens(prev_tokens) + decoder.embed_positions(prev_tokens)
    x = x.transpose(0, 1)
    causal = torch.triu(torch.full((t, t), float("-inf")), 1)
    self_pad = prev_tokens.eq(decoder.padding_idx)
    d = s * x
    for layer in decoder.layers if layers is None else layers:
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=self_pad, attn_mask=causal)[0]
        d, x = d + s * f, layer.self_attn_layer_norm(x + f)
        f = layer.encoder_attn(query=x, key=enc_out, value=enc_out, key_padding_mask=enc_pad, static_kv=True)[0]
        d, x = d + s * f, layer.encoder_attn_layer_norm(x + f)
        f = ffn(layer, x)
        d, x = d + s * f, layer.final_layer_norm(x + f)
    return (x + decoder.layer_norm(d)).transpose(0, 1)


def random_batch(model, bsz=3, src_len=7, tgt_len=5):
    torch.manual_seed(1)
    vocab = len(model.encoder.dictionary)
    pad = model.encoder.padding_idx
    src = torch.randint(4, vocab, (bsz, src_len))
    src[1, :3] = pad  # left-padded source, as fairseq batches it
    prev = torch.randint(4, vocab, (bsz, tgt_len))
    prev[2, -2:] = pad
    return src, (src != pad).sum(1), prev


def randomise_norms(model):
    # Fresh LayerNorms are the identity affine map; random ones catch a swapped norm.
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
