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


# --- the owned fairseq loops: fairseq's lines, each difference marked ------------------------

def _body_lines(function):
    """The function's source lines without its docstring, blank lines and trailing ``# ResiDual:`` notes."""
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(function))
    node = ast.parse(source).body[0]
    lines = source.splitlines()
    first = node.body[0]
    skip = set()
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        skip = set(range(first.lineno - 1, first.end_lineno))
    return [line for i, line in enumerate(lines) if i not in skip and line.strip()]


@pytest.mark.parametrize("ours,theirs", [
    ("ResiDualEncoder.forward_scriptable", "TransformerEncoderBase.forward_scriptable"),
    ("ResiDualDecoder.extract_features_scriptable", "TransformerDecoderBase.extract_features_scriptable"),
])
def test_owned_fairseq_loops_mark_every_line_that_differs(ours, theirs):
    """A reader checks the formula against resi_dual.py by reading the ``# ResiDual:`` lines alone:
    every other line of the owned loop is the installed fairseq's, in fairseq's order."""
    import difflib

    from fairseq.models import transformer
    from residual_fairseq.models import resi_dual

    def method(module, dotted):
        owner, name = dotted.split(".")
        return getattr(getattr(module, owner), name)

    mine = _body_lines(method(resi_dual, ours))
    fairseq_lines = _body_lines(method(transformer, theirs))
    marked = [line.split("  # ResiDual:")[0].rstrip() if "# ResiDual:" in line and line.strip()[0] != "#" else line
              for line in mine]
    unmarked_differences = []
    matcher = difflib.SequenceMatcher(a=fairseq_lines, b=[line.rstrip() for line in marked], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "delete":  # fairseq lines left out: a marked note must stand in their place
            if not any("# ResiDual:" in line for line in mine[max(j1 - 1, 0):j1 + 1]):
                unmarked_differences += [f"- {line.strip()}" for line in fairseq_lines[i1:i2]]
            continue
        unmarked_differences += [f"+ {line.strip()}" for line in mine[j1:j2] if "# ResiDual:" not in line]
    assert not unmarked_differences, "\n".join(unmarked_differences)
    assert sum("# ResiDual: eq." in line for line in mine) == 3  # (1), (2) and (3) of dual_stream.py
