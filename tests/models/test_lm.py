"""The ResiDual language model (resi_dual_lm): formula, incremental decoding, presets, options.

The reference re-composes the model's own submodules by the equations, written out
independently of the plugin's code path (decoder-only, causal mask, right padding):

    x_{k+1} = LN_k(x_k + F_k(x_k));  d_{k+1} = d_k + s F_k(x_k);  d_0 = s x_0
    y = x_N + LN_final(d_N);  logits = y E^T (shared embeddings)
"""
import argparse
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from fairseq import models, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_CONFIG_REGISTRY

from helpers.formula import randomise_norms
from residual_fairseq.models.lm import FAIRSEQ_PRESET_OF, ResiDualLanguageModel
from residual_fairseq.models.postln_layers import ModelConfigError
from residual_fairseq.variants import build_language_model, toy_dictionary

SMALL = dict(decoder_embed_dim=32, decoder_ffn_embed_dim=48, decoder_attention_heads=4, decoder_layers=3,
             share_decoder_input_output_embed=True)


def final_dual_norm(decoder):
    """The LayerNorm applied to d_N (the decoder's final-norm slot holds it)."""
    norms = [m for name, m in decoder.named_modules() if isinstance(m, torch.nn.LayerNorm)
             and name.startswith("layer_norm")]
    assert len(norms) == 1, [name for name, _ in decoder.named_modules() if name.startswith("layer_norm")]
    return norms[0]


def reference_logits(decoder, tokens, s, dual=True):
    t = tokens.size(1)
    pad = tokens.eq(decoder.padding_idx)
    x = decoder.embed_scale * decoder.embed_tokens(tokens) + decoder.embed_positions(tokens)
    x = x.transpose(0, 1)
    causal = torch.triu(torch.full((t, t), float("-inf")), 1)
    d = s * x
    for layer in decoder.layers:
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad, attn_mask=causal)[0]
        d, x = d + s * f, layer.self_attn_layer_norm(x + f)
        f = layer.fc2(layer.activation_fn(layer.fc1(x)))
        d, x = d + s * f, layer.final_layer_norm(x + f)
    y = (x + final_dual_norm(decoder)(d)) if dual else x
    return y.transpose(0, 1) @ decoder.embed_tokens.weight.t()


def padded_batch(vocab, pad, bsz=3, length=7):
    torch.manual_seed(1)
    tokens = torch.randint(4, vocab, (bsz, length))
    tokens[1, -3:] = pad  # language-model batches are right-padded
    return tokens


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_lm_matches_reference_formula(scale):
    model = build_language_model("resi_dual", dual_scale_decoder=scale, **SMALL)
    randomise_norms(model)
    model.eval()
    tokens = padded_batch(len(model.decoder.dictionary), model.decoder.padding_idx)
    real = tokens.ne(model.decoder.padding_idx)
    with torch.no_grad():
        logits, _ = model(tokens)
        expected = reference_logits(model.decoder, tokens, scale)
        torch.testing.assert_close(logits[real], expected[real], rtol=1e-5, atol=1e-5)
        # Guard against a vacuous reference: without the dual term the numbers differ.
        assert not torch.allclose(logits[real], reference_logits(model.decoder, tokens, scale, dual=False)[real],
                                  atol=1e-3)


def test_lm_is_causal():
    """Changing a later token leaves the earlier positions' outputs unchanged."""
    model = build_language_model("resi_dual", **SMALL)
    model.eval()
    tokens = padded_batch(len(model.decoder.dictionary), model.decoder.padding_idx)
    changed = tokens.clone()
    changed[0, 4] = 5 if tokens[0, 4] != 5 else 6
    with torch.no_grad():
        a, b = model(tokens)[0], model(changed)[0]
    torch.testing.assert_close(a[0, :4], b[0, :4])
    assert not torch.allclose(a[0, 4:], b[0, 4:])


def test_incremental_decoding_matches_full_forward():
    model = build_language_model("resi_dual", dual_scale_decoder=0.5, **SMALL)
    randomise_norms(model)
    model.eval()
    tokens = padded_batch(len(model.decoder.dictionary), model.decoder.padding_idx)[[0, 2]]
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_baselines_are_fairseq_transformer_lm():
    post, pre = build_language_model("post_ln", **SMALL), build_language_model("pre_ln", **SMALL)
    assert type(post).__name__ == type(pre).__name__ == "TransformerLanguageModel"
    assert not post.decoder.layers[0].normalize_before and post.decoder.layer_norm is None
    assert pre.decoder.layers[0].normalize_before and pre.decoder.layer_norm is not None
    resi = build_language_model("resi_dual", **SMALL)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(resi) == count(pre) == count(post) + 2 * SMALL["decoder_embed_dim"]


# --- presets ------------------------------------------------------------------------------

SCHEME_OPTIONS = {"dual_scale_decoder", "main_alpha_decoder", "decoder_normalize_before", "no_decoder_final_norm"}


@pytest.mark.parametrize("arch", sorted(FAIRSEQ_PRESET_OF))
def test_preset_has_the_sizes_of_fairseqs(arch):
    ours, theirs = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](ours)
    ARCH_CONFIG_REGISTRY[FAIRSEQ_PRESET_OF[arch]](theirs)
    assert {k: v for k, v in vars(ours).items() if k not in SCHEME_OPTIONS} == \
        {k: v for k, v in vars(theirs).items() if k not in SCHEME_OPTIONS}
    if arch != "resi_dual_lm":  # resi_dual_lm and transformer_lm are dataclass defaults, not presets
        assert ours.decoder_normalize_before is False and ours.no_decoder_final_norm is False
        assert ours.dual_scale_decoder == 1.0


@pytest.mark.parametrize("suffix", ["gpt2_tiny", "gpt2_small", "gpt2_medium", "wiki103"])
def test_preset_builds_a_model_of_fairseqs_size(suffix):
    dictionary = toy_dictionary(70000 if suffix == "wiki103" else 100)  # adaptive cutoffs 20000,60000
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    with torch.device("meta"):
        ours = models.build_model(OmegaConf.create({"_name": f"resi_dual_lm_{suffix}"}), task)
        theirs = models.build_model(OmegaConf.create({"_name": f"transformer_lm_{suffix}"}), task)
    assert isinstance(ours, ResiDualLanguageModel)
    assert len(ours.decoder.layers) == len(theirs.decoder.layers)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # transformer_lm_wiki103 has no final norm; ResiDual's LN(d_N) adds 2*d parameters there.
    extra = 2 * theirs.decoder.embed_dim if suffix == "wiki103" else 0
    assert count(ours) == count(theirs) + extra


# --- options from both entry points ---------------------------------------------------------

@pytest.fixture(scope="module")
def lm_dict_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lmdict")
    toy_dictionary().save(str(directory / "dict.txt"))
    return directory


def build_from_command_line(data, *flags):
    from fairseq import tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--task", "language_modeling", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model)


def test_command_line_options_reach_the_model(lm_dict_dir):
    model = build_from_command_line(lm_dict_dir, "--arch", "resi_dual_lm_gpt2_tiny", "--dual-scale-decoder",
                                    "0.25", "--decoder-layers", "3", "--tokens-per-sample", "64")
    assert isinstance(model, ResiDualLanguageModel)
    assert model.decoder.cfg.dual_scale_decoder == 0.25
    assert "dual_scale=0.25" in repr(model)
    assert len(model.decoder.layers) == 3 and model.decoder.embed_dim == 64  # gpt2_tiny's width
    assert model.decoder.max_target_positions == 64  # from --tokens-per-sample, as transformer_lm


@pytest.mark.parametrize("name", ["resi_dual_lm", "resi_dual_lm_gpt2_tiny"])
def test_hydra_config_options_reach_the_model(name):
    """fairseq's hydra-path builder: the dataclass model and a named preset both keep the field."""
    dictionary = toy_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    cfg = OmegaConf.create({"_name": name, "dual_scale_decoder": 0.375, "decoder_layers": 2,
                            "decoder_embed_dim": 32, "decoder_ffn_embed_dim": 32, "decoder_attention_heads": 2,
                            # what the dataclass interpolates from the task group in a full config
                            "tokens_per_sample": 64, "max_target_positions": None, "add_bos_token": False,
                            "tpu": False})
    model = models.build_model(cfg, task)
    assert isinstance(model, ResiDualLanguageModel)
    assert model.decoder.cfg.dual_scale_decoder == 0.375 and len(model.decoder.layers) == 2


@pytest.mark.parametrize("flags,message", [
    (["--decoder-normalize-before"], "does not apply to resi_dual"),
    (["--no-decoder-final-norm"], "LN\\(d_N\\) is part of its output"),
    (["--scale-attn"], "not supported"),
    (["--character-embeddings"], "not supported"),
])
def test_options_that_contradict_resi_dual_are_refused(lm_dict_dir, flags, message):
    with pytest.raises(ModelConfigError, match=message):
        build_from_command_line(lm_dict_dir, "--arch", "resi_dual_lm_gpt2_tiny", *flags)


def test_cutoffs_are_parsed_not_evaluated(lm_dict_dir):
    with pytest.raises(ModelConfigError, match="comma-separated integers"):
        build_from_command_line(lm_dict_dir, "--arch", "resi_dual_lm_gpt2_tiny", "--adaptive-input",
                                "--adaptive-input-cutoff", "__import__('os').getpid()")


@pytest.mark.parametrize("text,expected", [("20,40", [20, 40]), ("[20,40]", [20, 40]), ("(20, 40)", [20, 40]),
                                           ("20", [20]), (" 20, 40 ", [20, 40]), ("2e4,6e4", [20000, 60000])])
def test_cutoffs_take_the_forms_fairseq_takes(lm_dict_dir, text, expected):
    """fairseq's transformer_lm reads the cutoffs with eval_str_list: "20,40", "[20,40]" and
    "20" all work there, so they work here, parsed as literals (never eval'd)."""
    from fairseq.utils import eval_str_list
    from residual_fairseq.models.lm import parse_cutoffs

    assert parse_cutoffs(text, "adaptive_input_cutoff") == expected == eval_str_list(text, type=int)
    assert parse_cutoffs(OmegaConf.create({"c": expected}).c, "adaptive_input_cutoff") == expected
    if text == "[20,40]":  # the form the old parser refused, through fairseq's command line to the model
        model = build_from_command_line(lm_dict_dir, "--arch", "resi_dual_lm_gpt2_tiny", "--adaptive-input",
                                        "--adaptive-input-cutoff", text, "--adaptive-input-factor", "2")
        assert model.decoder.embed_tokens.cutoff == expected + [len(model.decoder.dictionary)]


@pytest.mark.parametrize("value", ["[20.5, 40]", "[True]", "['20']", "", "[]", "20,,40", "abc", "nan", [20.5]])
def test_cutoffs_that_are_not_integers_are_one_error(value):
    from residual_fairseq.models.lm import parse_cutoffs

    with pytest.raises(ModelConfigError, match="--adaptive-softmax-cutoff wants comma-separated integers or a list"):
        parse_cutoffs(value, "adaptive_softmax_cutoff")


@pytest.mark.parametrize("flag,value", [("--dual-scale-decoder", "0"), ("--main-alpha-decoder", "-1"),
                                        ("--dual-scale-decoder", "nan"), ("--decoder-layers", "0")])
def test_bad_numbers_are_one_argparse_error(lm_dict_dir, flag, value, capsys):
    with pytest.raises(SystemExit):
        build_from_command_line(lm_dict_dir, "--arch", "resi_dual_lm_gpt2_tiny", flag, value)
    assert "must be a finite positive number" in capsys.readouterr().err
