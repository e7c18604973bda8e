"""Half precision at depth: a 48-layer ResiDual stays finite, and the dual-stream scale is why.

fairseq's --bf16 implies a TPU and --fp16 needs CUDA on a CPU machine, so these run
at module level (``model.to(dtype)``), which is what those flags do to the model.
"""
import pytest
import torch

from residual_fairseq.variants import build_model

NARROW = dict(
    encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=2,
    decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_attention_heads=2, dropout=0.0,
)


def deep_model(layers, scale, seed=0):
    torch.manual_seed(seed)
    return build_model(
        "resi_dual", encoder_layers=layers, decoder_layers=layers,
        dual_scale_encoder=scale, dual_scale_decoder=scale, **NARROW,
    )


def record_final_dual_streams(model):
    """Keep d_N of both stacks as LN_final reads it."""
    seen = {}
    for name, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        def keep_input(module, args, name=name):
            seen[name] = args[0]
        stack.layer_norm.register_forward_pre_hook(keep_input)
    return seen


def forward_backward(model, dtype, seed=0):
    model = model.to(dtype)
    g = torch.Generator().manual_seed(seed)
    src, prev, target = (torch.randint(4, 100, shape, generator=g) for shape in [(4, 12), (4, 10), (4, 10)])
    logits, _ = model(src, torch.full((4,), 12), prev)
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
    loss.backward()
    grads_finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return loss, grads_finite


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_48_layers_train_step_is_finite_in_half_precision(dtype):
    loss, grads_finite = forward_backward(deep_model(48, scale=0.05), dtype)
    assert torch.isfinite(loss) and grads_finite


def test_unscaled_dual_stream_grows_with_depth():
    """d_N sums x_0 and 2N encoder sublayer outputs, so its magnitude grows with N."""
    rms = {}
    for layers in (6, 12, 24, 48):
        values = []
        for seed in range(3):
            model = deep_model(layers, scale=1.0, seed=seed).eval()
            seen = record_final_dual_streams(model)
            with torch.no_grad():
                model.encoder(torch.randint(4, 100, (8, 20)), src_lengths=torch.full((8,), 20))
            values.append(seen["encoder"].pow(2).mean().sqrt().item())
        rms[layers] = sum(values) / len(values)
    assert rms[6] < rms[12] < rms[24] < rms[48], rms
    # Measured at init: ~1.9 at 6 layers, ~5.1 at 48 (about sqrt(N) growth).
    assert rms[48] > 2 * rms[6], rms


def test_dual_stream_is_exactly_proportional_to_the_scale():
    """d_N(s) = s * d_N(1): the main stream, and so every F_k, does not depend on s.

    (Checked on the encoder; the decoder's F_k read the encoder output, which s
    touches through LN_final's epsilon.)
    """
    src = torch.randint(4, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    seen = {}
    for scale in (1.0, 0.05):
        model = deep_model(12, scale=scale).eval()
        seen[scale] = record_final_dual_streams(model)
        with torch.no_grad():
            model.encoder(src, src_lengths=torch.full((2,), 9))
    torch.testing.assert_close(seen[0.05]["encoder"], 0.05 * seen[1.0]["encoder"], rtol=1e-5, atol=1e-6)


def test_fp16_overflows_without_scaling_and_not_with_it():
    """Trained sublayers add consistent offsets, which the dual stream sums over depth.

    A constant FFN bias of 1500 stands in for that: 48 encoder FFNs put 72,000 in
    d_N, beyond fp16's 65,504, while the Post-LN main stream stays normalised.
    """
    results = {}
    for scale in (1.0, 0.05):
        model = deep_model(48, scale=scale)
        with torch.no_grad():
            for layer in model.encoder.layers:
                layer.fc2.bias.fill_(1500.0)
        seen = record_final_dual_streams(model)
        loss, grads_finite = forward_backward(model, torch.float16)
        results[scale] = (torch.isinf(seen["encoder"]).any().item(), torch.isfinite(loss).item() and grads_finite)
    assert results[1.0] == (True, False), results
    assert results[0.05] == (False, True), results
