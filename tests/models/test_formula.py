"""The ResiDual model computes exactly the formula of the paper.

The reference (helpers/formula.py) re-composes the model's own submodules (attention, FFN, norms)
by the equations, written out independently of the plugin's code path:

    x_{k+1} = LN_k(x_k + F_k(x_k));  d_{k+1} = d_k + s F_k(x_k);  d_0 = s x_0
    y = x_N + LN_final(d_N)
"""
import pytest
import torch

from helpers.formula import SMALL, random_batch, randomise_norms, reference_decoder_features, reference_encoder
from residual_fairseq.variants import build_model

FINAL_NORMS = ("encoder.layer_norm.", "decoder.layer_norm.")  # LN_final, not in a Post-LN model


@pytest.mark.parametrize("s_enc,s_dec", [(1.0, 1.0), (0.05, 0.3)])
def test_encoder_and_decoder_match_reference(s_enc, s_dec):
    model = build_model("resi_dual", dual_scale_encoder=s_enc, dual_scale_decoder=s_dec, **SMALL)
    randomise_norms(model)
    model.eval()
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        expected_enc = reference_encoder(model.encoder, src, s_enc)
        torch.testing.assert_close(enc["encoder_out"][0], expected_enc, rtol=1e-5, atol=1e-5)

        features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
        expected = reference_decoder_features(
            model.decoder, prev, expected_enc, src.eq(model.encoder.padding_idx), s_dec
        )
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
        logits, _ = model(src, lengths, prev)
        torch.testing.assert_close(logits, model.decoder.output_layer(expected), rtol=1e-5, atol=1e-5)


def test_reference_detects_a_missing_dual_stream_term():
    """Guard against a vacuous comparison: leaving out any one dual add changes the output."""
    model = build_model("resi_dual", dual_scale_encoder=0.5, **SMALL)
    randomise_norms(model)
    model.eval()
    src, lengths, _ = random_batch(model)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        torch.testing.assert_close(out, reference_encoder(model.encoder, src, 0.5), rtol=1e-5, atol=1e-5)
        for term in range(1, 2 * len(model.encoder.layers) + 1):
            wrong = reference_encoder(model.encoder, src, 0.5, drop_dual_term=term)
            assert not torch.allclose(out, wrong, atol=1e-4), term


def test_output_is_main_stream_plus_normalised_dual_stream():
    """Zeroing LN_final's gain leaves exactly the Post-LN main stream x_N (plus LN bias)."""
    model = build_model("resi_dual", **SMALL)
    post_ln = build_model("post_ln", **SMALL)
    post_ln.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith(FINAL_NORMS)}
    )
    model.encoder.layer_norm.weight.data.zero_()
    model.encoder.layer_norm.bias.data.zero_()
    model.eval(), post_ln.eval()
    src, lengths, _ = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(
            model.encoder(src, src_lengths=lengths)["encoder_out"][0],
            post_ln.encoder(src, src_lengths=lengths)["encoder_out"][0],
        )


@pytest.mark.parametrize("scale", [0.05, 1e-3])
def test_dual_scale_does_not_change_the_output(scale):
    """s changes only the range of d: LN_final's eps scales with s^2, so y is the same."""
    a = build_model("resi_dual", **SMALL)
    b = build_model("resi_dual", dual_scale_encoder=scale, dual_scale_decoder=scale, **SMALL)
    b.load_state_dict(a.state_dict())
    randomise_norms(a)
    b.load_state_dict(a.state_dict())
    a.eval(), b.eval()
    src, lengths, prev = random_batch(a)
    with torch.no_grad():
        out_a = torch.log_softmax(a(src, lengths, prev)[0], -1)
        out_b = torch.log_softmax(b(src, lengths, prev)[0], -1)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 0.05])
def test_matches_the_authors_definition_at_s_1(scale):
    """The authors' final norm: eps 1e-7 at s = 1. Any s here gives that model's output."""
    model = build_model("resi_dual", dual_scale_encoder=scale, **SMALL)
    randomise_norms(model)
    model.eval()
    src, lengths, _ = random_batch(model)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        authors = reference_encoder(model.encoder, src, 1.0, final_norm_eps=1e-7)
        fairseq_eps = reference_encoder(model.encoder, src, scale, final_norm_eps=1e-5)
    torch.testing.assert_close(out, authors, rtol=0, atol=1e-5)
    if scale != 1.0:  # an unscaled eps would not do: the guard above can fail
        assert not torch.allclose(out, fairseq_eps, rtol=0, atol=1e-5)
