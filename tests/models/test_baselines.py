"""DeepNet, Admin and B2T compute exactly their papers' formulas.

Each reference below re-composes the model's own submodules (attention, FFN, norms)
by the equations, written out independently of the plugin's code path
(``PostLNEncoderLayer.sublayers`` / ``combine`` are not called):

    DeepNet  x <- LN(alpha * x + F(x))           alpha from the depths (Wang et al. 2022)
    Admin    x <- LN(omega_i * x + F(x))         omega_i a vector per sublayer (Liu et al. 2020)
    B2T      h <- LN(x + F_1(x)) ... y = LN(h + F_last(h) + x)    (Takase et al. 2023)
"""
import json
import math

import pytest
import torch

from residual_fairseq.models import admin as admin_module
from residual_fairseq.models import deepnet
from residual_fairseq.models.postln_layers import ModelConfigError
from residual_fairseq.variants import build_model
from helpers.formula import SMALL, ffn, random_batch, randomise_norms

BASELINES = ("deepnet", "admin", "b2t")


def residual_rule(variant, layer, stack):
    """``rule(k, x, f, layer_input, last)``: the sum the k-th sublayer's norm normalises."""
    if variant == "deepnet":
        n, m = SMALL["encoder_layers"], SMALL["decoder_layers"]
        alpha = 0.81 * (n ** 4 * m) ** (1 / 16) if stack == "encoder" else (3 * m) ** 0.25
        return lambda k, x, f, x_in, last: alpha * x + f
    if variant == "admin":
        names = ["omega_self_attn", "omega_ffn"] if stack == "encoder" else \
            ["omega_self_attn", "omega_cross_attn", "omega_ffn"]
        return lambda k, x, f, x_in, last: getattr(layer, names[k]) * x + f
    if variant == "b2t":
        return lambda k, x, f, x_in, last: x + f + (x_in if last else 0)
    raise ValueError(variant)


def reference_encoder(variant, encoder, src_tokens):
    pad = src_tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(src_tokens)
    x = (x * (~pad).unsqueeze(-1).type_as(x)).transpose(0, 1)
    for layer in encoder.layers:
        rule, x_in = residual_rule(variant, layer, "encoder"), x
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad)[0]
        x = layer.self_attn_layer_norm(rule(0, x, f, x_in, False))
        x = layer.final_layer_norm(rule(1, x, ffn(layer, x), x_in, True))
    return x


def reference_decoder_features(variant, decoder, prev_tokens, enc_out, enc_pad):
    t = prev_tokens.size(1)
    x = decoder.embed_scale * decoder.embed_tokens(prev_tokens) + decoder.embed_positions(prev_tokens)
    x = x.transpose(0, 1)
    causal = torch.triu(torch.full((t, t), float("-inf")), 1)
    self_pad = prev_tokens.eq(decoder.padding_idx)
    for layer in decoder.layers:
        rule, x_in = residual_rule(variant, layer, "decoder"), x
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=self_pad, attn_mask=causal)[0]
        x = layer.self_attn_layer_norm(rule(0, x, f, x_in, False))
        f = layer.encoder_attn(query=x, key=enc_out, value=enc_out, key_padding_mask=enc_pad, static_kv=True)[0]
        x = layer.encoder_attn_layer_norm(rule(1, x, f, x_in, False))
        x = layer.final_layer_norm(rule(2, x, ffn(layer, x), x_in, True))
    return x.transpose(0, 1)


def randomise_omegas(model):
    torch.manual_seed(2)
    for name, p in model.named_parameters():
        if ".omega_" in name:
            p.data.uniform_(0.5, 3.0)


def small_model(variant, **options):
    model = build_model(variant, **{**SMALL, **options})
    randomise_norms(model)
    randomise_omegas(model)
    return model.eval()


@pytest.mark.parametrize("variant", BASELINES)
def test_model_matches_reference(variant):
    model = small_model(variant)
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        expected_enc = reference_encoder(variant, model.encoder, src)
        torch.testing.assert_close(enc["encoder_out"][0], expected_enc, rtol=1e-5, atol=1e-5)
        features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
        expected = reference_decoder_features(
            variant, model.decoder, prev, expected_enc, src.eq(model.encoder.padding_idx))
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
        logits, _ = model(src, lengths, prev)
        torch.testing.assert_close(logits, model.decoder.output_layer(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", BASELINES)
def test_reference_is_not_plain_post_ln(variant):
    """Guard against a vacuous comparison: the same weights in Post-LN compute something else."""
    model = small_model(variant)
    post_ln = build_model("post_ln", **SMALL).eval()
    post_ln.load_state_dict({k: v for k, v in model.state_dict().items() if ".omega_" not in k})
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        ours = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        theirs = post_ln.encoder(src, src_lengths=lengths)["encoder_out"][0]
    assert not torch.allclose(ours, theirs, atol=1e-3)


# --- DeepNet's constants and initialisation --------------------------------------------------

@pytest.mark.parametrize("n,m", [(1, 1), (6, 6), (18, 18), (100, 100), (12, 3), (3, 12)])
def test_deepnet_constants_are_the_papers(n, m):
    # Wang et al. 2022, Table 1 (encoder-decoder): written out, not computed by the module's code.
    alpha_enc, beta_enc = deepnet.encoder_constants(n, m)
    alpha_dec, beta_dec = deepnet.decoder_constants(m)
    assert alpha_enc == pytest.approx(0.81 * (n ** 4 * m) ** 0.0625, rel=1e-12)
    assert beta_enc == pytest.approx(0.87 * (n ** 4 * m) ** -0.0625, rel=1e-12)
    assert alpha_dec == pytest.approx((3 * m) ** 0.25, rel=1e-12)
    assert beta_dec == pytest.approx((12 * m) ** -0.25, rel=1e-12)


def test_deepnet_constants_reach_every_layer():
    with torch.device("meta"):  # shapes only: a deep model in milliseconds
        model = build_model("deepnet", encoder_layers=12, decoder_layers=3, encoder_embed_dim=16,
                            decoder_embed_dim=16, encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16,
                            encoder_attention_heads=2, decoder_attention_heads=2)
    assert {(layer.alpha, layer.beta) for layer in model.encoder.layers} == {deepnet.encoder_constants(12, 3)}
    assert {(layer.alpha, layer.beta) for layer in model.decoder.layers} == {deepnet.decoder_constants(3)}


def xavier_normal_std(weight, gain):
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("n,m", [(6, 6), (18, 2)])
def test_deepnet_init_scales_values_outputs_and_ffn_by_beta(n, m):
    torch.manual_seed(0)
    dim, hidden = 128, 512
    model = build_model("deepnet", encoder_layers=n, decoder_layers=m, encoder_embed_dim=dim, decoder_embed_dim=dim,
                        encoder_ffn_embed_dim=hidden, decoder_ffn_embed_dim=hidden,
                        encoder_attention_heads=4, decoder_attention_heads=4)
    for stack, beta in (("encoder", 0.87 * (n ** 4 * m) ** -0.0625), ("decoder", (12 * m) ** -0.25)):
        layer = getattr(model, stack).layers[-1]
        attentions = [layer.self_attn] + ([layer.encoder_attn] if stack == "decoder" else [])
        weights = [(a.v_proj.weight, beta) for a in attentions] + [(a.out_proj.weight, beta) for a in attentions]
        weights += [(a.q_proj.weight, 1.0) for a in attentions] + [(a.k_proj.weight, 1.0) for a in attentions]
        weights += [(layer.fc1.weight, beta), (layer.fc2.weight, beta)]
        for weight, gain in weights:
            # 16k+ samples of a normal: the sample std is within ~1% of the true one.
            assert weight.std().item() == pytest.approx(xavier_normal_std(weight, gain), rel=0.04)
            assert abs(weight.mean().item()) < 0.05 * xavier_normal_std(weight, gain)


# --- Admin's profiling -----------------------------------------------------------------------

def hand_profile(model, src, lengths, prev):
    """Transformer-Clinic's profiling pass, written out: omega_1 = 1, then
    omega_{i+1} = sqrt(Var[omega_i * x_i] + Var[F_i]) over the real tokens, sublayer by sublayer."""
    def var(t, mask):
        return t.transpose(0, 1)[mask].double().var(unbiased=False).item()

    def run_stack(layers, x, sublayer_calls, mask):
        ratio, profile = 1.0, []
        for layer in layers:
            values = []
            for k, call in enumerate(sublayer_calls):
                f = call(layer, x)
                values.append(ratio)
                next_ratio = math.sqrt(var(ratio * x, mask) + var(f, mask))
                x = [layer.self_attn_layer_norm, *([layer.encoder_attn_layer_norm] if len(sublayer_calls) == 3 else []),
                     layer.final_layer_norm][k](ratio * x + f)
                ratio = next_ratio
            profile.append(values)
        return profile, x

    enc, dec = model.encoder, model.decoder
    src_pad = src.eq(enc.padding_idx)
    x, _ = enc.forward_embedding(src)
    x = (x * (~src_pad).unsqueeze(-1).type_as(x)).transpose(0, 1)
    encoder_profile, enc_out = run_stack(enc.layers, x, [
        lambda layer, x: layer.self_attn(query=x, key=x, value=x, key_padding_mask=src_pad)[0],
        lambda layer, x: ffn(layer, x)], ~src_pad)

    t = prev.size(1)
    causal = torch.triu(torch.full((t, t), float("-inf")), 1)
    prev_pad = prev.eq(dec.padding_idx)
    y = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    decoder_profile, _ = run_stack(dec.layers, y, [
        lambda layer, x: layer.self_attn(query=x, key=x, value=x, key_padding_mask=prev_pad, attn_mask=causal)[0],
        lambda layer, x: layer.encoder_attn(query=x, key=enc_out, value=enc_out, key_padding_mask=src_pad,
                                            static_kv=True)[0],
        lambda layer, x: ffn(layer, x)], ~prev_pad)
    return {"encoder": encoder_profile, "decoder": decoder_profile}


def test_admin_profile_matches_hand_computation():
    # No dropout, so the profiling pass (run in training mode, as the reference does) is deterministic.
    model = build_model("admin", dropout=0.0, **SMALL)
    randomise_norms(model)
    src, lengths, prev = random_batch(model)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}
    profile = admin_module.profile_omegas(model, [sample])
    with torch.no_grad():
        expected = hand_profile(model.eval(), src, lengths, prev)
    assert [len(values) for values in profile["encoder"]] == [2] * SMALL["encoder_layers"]
    assert [len(values) for values in profile["decoder"]] == [3] * SMALL["decoder_layers"]
    for stack in ("encoder", "decoder"):
        assert profile[stack][0][0] == 1.0
        assert profile[stack] == [pytest.approx(values, rel=1e-6) for values in expected[stack]]
    # ... and are set in the model.
    assert admin_module.model_omegas(model) == {
        stack: [pytest.approx(values, rel=1e-6) for values in profile[stack]] for stack in profile}


def test_admin_profiling_with_dropout_is_reproducible():
    model = build_model("admin", dropout=0.3, **SMALL)
    src, lengths, prev = random_batch(model)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}
    first = admin_module.profile_omegas(model, [sample], seed=5)
    assert admin_module.profile_omegas(model, [sample], seed=5) == first
    assert admin_module.profile_omegas(model, [sample], seed=6) != first


def test_admin_profile_file_round_trip_initialises_a_model(tmp_path):
    model = build_model("admin", **SMALL)
    src, lengths, prev = random_batch(model)
    profile = admin_module.profile_omegas(
        model, [{"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}])
    path = admin_module.write_profile(profile, tmp_path / "profile.json")
    assert admin_module.read_profile(path) == profile
    fresh = build_model("admin", admin_profile=str(path), **SMALL)
    # float32 parameters hold the float64 profile to ~1e-7.
    assert admin_module.model_omegas(fresh) == {s: [pytest.approx(v, rel=1e-6) for v in profile[s]] for s in profile}
    with pytest.raises(ModelConfigError, match="has 3 encoder layers, the model 2"):
        build_model("admin", admin_profile=str(path), **{**SMALL, "encoder_layers": 2})


def header(**stacks):
    return {"format": admin_module.PROFILE_FORMAT, "version": 1, **stacks}


@pytest.mark.parametrize("content,message", [
    ("not json {", "not a valid JSON profile"),
    (json.dumps({"encoder": [[1.0]], "decoder": [[1.0]]}), "lacks the header"),
    (json.dumps(header(encoder=[[1.0, "2"]], decoder=[])), "not a finite positive number"),
    (json.dumps(header(encoder=[[1.0, -2.0]], decoder=[])), "not a finite positive number"),
    (json.dumps(header(encoder=[[1.0, True]], decoder=[])), "not a finite positive number"),
    (json.dumps(header(encoder=[[1.0, 10 ** 400]], decoder=[])), "not a finite positive number"),  # overflows a float
    (json.dumps(header(encoder=[[1.0]], decoder=[])).replace("1.0", "NaN"), "not a valid JSON profile"),
    (json.dumps(header(encoder=[[1.0]], decoder=[])).replace("1.0", "Infinity"), "not a valid JSON profile"),
    (json.dumps(header(encoder={"a": 1}, decoder=[])), "must be a list of lists"),
    (json.dumps({**header(encoder=[], decoder=[]), "version": 99}), "unsupported version"),
    ("[" * 100000, "not a valid JSON profile"),  # deep nesting: a RecursionError in some parsers
])
def test_hostile_profile_files_are_refused_with_one_line(tmp_path, content, message):
    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(ModelConfigError, match=message) as info:
        admin_module.read_profile(path)
    assert "\n" not in str(info.value)


def test_oversized_or_missing_profile_is_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (admin_module.MAX_PROFILE_BYTES + 1))
    with pytest.raises(ModelConfigError, match="more than any profile needs"):
        admin_module.read_profile(big)
    with pytest.raises(ModelConfigError, match="missing.json: No such file or directory"):
        build_model("admin", admin_profile=str(tmp_path / "missing.json"), **SMALL)
    # What a loaded checkpoint's config says: its omegas come with its weights, no file is read.
    from residual_fairseq.checkpoints import WEIGHTS_FROM_CHECKPOINT

    assert build_model("admin", admin_profile=WEIGHTS_FROM_CHECKPOINT, **SMALL) is not None
    with pytest.raises(ModelConfigError, match="not a regular file"):
        admin_module.read_profile("/dev/zero")  # would never end
    with pytest.raises(ModelConfigError, match="not a regular file"):
        admin_module.read_profile(tmp_path)


# --- decoding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", BASELINES)
def test_incremental_decoding_matches_teacher_forcing(variant):
    model = small_model(variant)
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(prev.size(1))]
    real = prev.ne(model.decoder.padding_idx)
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", BASELINES)
def test_torchscript_matches_eager(variant):
    model = small_model(variant)
    src, lengths, prev = random_batch(model)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(src, lengths, prev)[0], model(src, lengths, prev)[0])


def test_tools_profile_fresh_admin_models(toy_data_bin):
    """The diagnostics (and the depth benchmark) start Admin as its training would: profiled."""
    from residual_fairseq.analysis import fresh_model, load_task, measurement_batches

    task = load_task(toy_data_bin)
    batches = measurement_batches(task, "train", max_tokens=300, num_batches=1)
    sizes = dict(encoder_layers=2, decoder_layers=2, embed_dim=16, ffn_dim=32, heads=2)
    profiled = admin_module.model_omegas(fresh_model("admin", task, profile_batches=batches, **sizes))
    assert profiled["encoder"][0][0] == 1.0 and profiled["encoder"][1][0] > 1.0
    assert profiled == admin_module.model_omegas(fresh_model("admin", task, profile_batches=batches, **sizes))
    unprofiled = admin_module.model_omegas(fresh_model("admin", task, **sizes))
    assert {value for stack in unprofiled.values() for layer in stack for value in layer} == {1.0}
