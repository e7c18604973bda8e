"""The paper's authors' option names, checkpoints and configs.

Their implementation (microsoft/ResiDual: a fairseq 0.12 user dir) registers a model
``resi_dual`` with a config dataclass (fairseq's ``TransformerConfig`` plus
enc/dec_res_input_norm_scale and enc/dec_alpha) and fairseq's layer classes. What its
checkpoints hold is built here with fairseq alone, as fairseq's trainer writes it:
``args`` None, ``cfg`` the whole config as a plain container (``cfg["model"]``: ``_name``
resi_dual, nested ``encoder``/``decoder`` dicts with ``normalize_before: true`` as in
their yamls), and the weights of fairseq's own transformer of those sizes, whose
``encoder.layer_norm`` / ``decoder.layer_norm`` are their LN_final. The reference
decoding re-composes those weights by their formula, independently of the plugin:

    x_{k+1} = LN_k(x_k + F_k);  res_{k+1} = res_k + s F_k;  res_0 = s x_0
    y = alpha * x_N + LayerNorm_{eps=1e-7}(res_N)
"""
import argparse
import re
import subprocess
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
import yaml
from omegaconf import OmegaConf

from fairseq import checkpoint_utils, models, options
from fairseq.dataclass.configs import FairseqConfig
from fairseq.models.transformer import TransformerConfig, TransformerModelBase
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from helpers import USER_DIR, fairseq_cli, run
from residual_fairseq.convert import convert_checkpoint, main
from residual_fairseq.variants import toy_dictionary

AUTHORS_EPS = 1e-7  # their LN_final's eps, whatever s is


@dataclass
class AuthorsConfig(TransformerConfig):
    """The fields the authors' dataclass adds to fairseq's TransformerConfig."""

    enc_alpha: float = field(default=1.0)
    dec_alpha: float = field(default=1.0)
    enc_res_input_norm_scale: float = field(default=1.0)
    dec_res_input_norm_scale: float = field(default=1.0)


def authors_model_section(s_enc=0.05, s_dec=0.05, a_enc=0.8, a_dec=1.25, dim=32, ffn=64, layers=2, heads=4):
    """``model:`` of a yaml in the style of the authors' iwslt.yaml (smaller)."""
    stack = {"embed_dim": dim, "ffn_embed_dim": ffn, "layers": layers, "attention_heads": heads,
             "normalize_before": True}
    return {
        "_name": "resi_dual", "dropout": 0.3, "activation_dropout": 0.1, "attention_dropout": 0.1,
        "encoder": dict(stack), "decoder": {**stack, "output_dim": dim}, "share_all_embeddings": True,
        "enc_res_input_norm_scale": s_enc, "dec_res_input_norm_scale": s_dec, "enc_alpha": a_enc,
        "dec_alpha": a_dec, "base_layers": 0,
    }


def authors_checkpoint(data_bin, path, seed=0, **settings):
    """A checkpoint in the authors' layout; returns (path, fairseq's model of its weights, settings)."""
    root = OmegaConf.structured(FairseqConfig())
    OmegaConf.set_struct(root, False)
    root.model = OmegaConf.merge(OmegaConf.structured(AuthorsConfig()), authors_model_section(**settings))
    root.task = OmegaConf.merge(OmegaConf.structured(TranslationConfig()), {
        "_name": "translation", "data": str(data_bin), "source_lang": "src", "target_lang": "tgt"})
    task = TranslationTask.setup_task(root.task)
    torch.manual_seed(seed)
    model = TransformerModelBase.build_model(root.model, task)  # fairseq's layers, the authors' names
    with torch.no_grad():  # a final norm that is not the identity, so that eps and s show
        for name in ("encoder.layer_norm", "decoder.layer_norm"):
            model.get_submodule(name).weight.normal_(1.0, 0.3)
            model.get_submodule(name).bias.normal_(0.0, 0.3)
    state = {
        "args": None,  # as fairseq's Trainer.state_dict writes it
        "cfg": OmegaConf.to_container(root, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam", "lr_scheduler_state": {"best": None},
                               "num_updates": 0}],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 0.0},
    }
    torch.save(state, path)
    return path, model.eval(), root.model


def test_the_fixture_has_the_authors_layout(toy_data_bin, tmp_path):
    path, _, _ = authors_checkpoint(toy_data_bin, tmp_path / "authors.pt")
    state = torch.load(path, weights_only=True)
    cfg = state["cfg"]["model"]
    assert state["args"] is None and type(cfg) is dict and cfg["_name"] == "resi_dual"
    for side in ("encoder", "decoder"):
        assert {"embed_dim", "ffn_embed_dim", "layers", "attention_heads", "normalize_before", "learned_pos",
                "layerdrop", "layers_to_keep", "xformers_att_config"} <= set(cfg[side])
        assert cfg[side]["normalize_before"] is True
    assert {"input_dim", "output_dim"} <= set(cfg["decoder"])
    assert {"enc_res_input_norm_scale", "dec_res_input_norm_scale", "enc_alpha", "dec_alpha",
            "share_all_embeddings", "dropout"} <= set(cfg)
    assert {"encoder.layer_norm.weight", "encoder.layer_norm.bias", "decoder.layer_norm.weight",
            "decoder.layer_norm.bias"} <= set(state["model"])


# --- the reference: the authors' formula over fairseq's modules -----------------------------------

def _ffn(layer, x):
    return layer.fc2(layer.activation_fn(layer.fc1(x)))


def _final(norm, res, eps):
    return F.layer_norm(res, norm.weight.shape, norm.weight, norm.bias, eps)


def reference_log_probs(model, cfg, src, prev, eps=AUTHORS_EPS):
    """log p(prev[t+1] | ...) of the authors' ResiDual, teacher-forced, from ``model``'s weights (float64)."""
    encoder, decoder = model.encoder, model.decoder
    s_enc, s_dec = cfg.enc_res_input_norm_scale, cfg.dec_res_input_norm_scale
    src_pad = src.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(src)
    x = (x * (~src_pad).unsqueeze(-1).type_as(x)).transpose(0, 1)
    res = x * s_enc
    for layer in encoder.layers:
        f = layer.self_attn(query=x, key=x, value=x, key_padding_mask=src_pad, need_weights=False)[0]
        res, x = res + f * s_enc, layer.self_attn_layer_norm(x + f)
        f = _ffn(layer, x)
        res, x = res + f * s_enc, layer.final_layer_norm(x + f)
    enc = x * cfg.enc_alpha + _final(encoder.layer_norm, res, eps)

    x = decoder.embed_scale * decoder.embed_tokens(prev) + decoder.embed_positions(prev)
    x = x.transpose(0, 1)
    res = x * s_dec
    future = decoder.buffered_future_mask(x)
    for layer in decoder.layers:
        f = layer.self_attn(query=x, key=x, value=x, attn_mask=future, need_weights=False)[0]
        res, x = res + f * s_dec, layer.self_attn_layer_norm(x + f)
        f = layer.encoder_attn(query=x, key=enc, value=enc, key_padding_mask=src_pad, static_kv=True,
                               need_weights=False)[0]
        res, x = res + f * s_dec, layer.encoder_attn_layer_norm(x + f)
        f = _ffn(layer, x)
        res, x = res + f * s_dec, layer.final_layer_norm(x + f)
    y = x * cfg.dec_alpha + _final(decoder.layer_norm, res, eps)
    return F.log_softmax(decoder.output_layer(y.transpose(0, 1)).double(), dim=-1)


def reference_greedy(model, cfg, src_row, max_len):
    """Greedy decoding by the reference, as fairseq's beam search of width 1 decodes (no EOS at step 0,
    never PAD, EOS forced at max_len)."""
    eos, pad = model.decoder.dictionary.eos(), model.decoder.dictionary.pad()
    prev = [eos]
    for step in range(max_len + 1):
        lprobs = reference_log_probs(model, cfg, src_row[None], torch.tensor([prev]))[0, -1]
        lprobs[pad] = float("-inf")
        if step == 0:
            lprobs[eos] = float("-inf")
        token = eos if step == max_len else int(lprobs.argmax())
        prev.append(token)
        if token == eos:
            break
    return prev[1:]


def test_authors_checkpoint_converts_and_decodes_identically(toy_data_bin, tmp_path, capsys):
    source, theirs, cfg = authors_checkpoint(toy_data_bin, tmp_path / "authors.pt")
    output = tmp_path / "converted.pt"
    assert main([str(source), str(output)]) is None
    err = capsys.readouterr().err.strip().splitlines()
    # Their stored normalize_before (no effect in their layers) is dropped, said in one line.
    assert len(err) == 1 and err[0].startswith("note: dropped encoder.normalize_before and "
                                               "decoder.normalize_before"), err
    [converted], _ = checkpoint_utils.load_model_ensemble([str(output)])
    assert type(converted).__name__ == "ResiDualModel"
    assert (converted.encoder.dual_scale, converted.decoder.dual_scale) == (0.05, 0.05)
    assert (converted.encoder.main_alpha, converted.decoder.main_alpha) == (0.8, 1.25)
    converted.eval()

    vocab = len(theirs.encoder.dictionary)
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (3, 7), generator=generator)
    src[0, :2] = theirs.encoder.padding_idx  # fairseq pads sources on the left
    prev = torch.cat([torch.full((3, 1), theirs.decoder.dictionary.eos()),
                      torch.randint(4, vocab, (3, 5), generator=generator)], dim=1)
    with torch.no_grad():
        ours64 = F.log_softmax(converted.double()(src, src.ne(1).sum(1), prev)[0].double(), dim=-1)
        theirs64 = theirs.double()
        # The same function of the same weights: identical up to float64 rounding with LN_final's
        # eps as here (1e-7 s^2). With theirs (1e-7 at every s) LN_final's output moves by about
        # 1e-7 / (2 Var(d_N)) relative (docs/conversion.md): here (untrained, s = 0.05) ~7e-5 in log-probs.
        same_eps = reference_log_probs(theirs64, cfg, src, prev, eps=AUTHORS_EPS * 0.05 ** 2)
        assert torch.allclose(ours64, same_eps, rtol=0, atol=1e-9)
        authors_eps = reference_log_probs(theirs64, cfg, src, prev)
        assert 1e-7 < (ours64 - authors_eps).abs().max() < 2e-4
        converted.float()

        max_len = 12
        generator = SequenceGenerator([converted], converted.decoder.dictionary, beam_size=1,
                                      max_len_a=0, max_len_b=max_len)
        hyps = generator.forward({"net_input": {"src_tokens": src[1:], "src_lengths": src[1:].ne(1).sum(1)}})
        for row, hyp in zip(src[1:], hyps):
            assert hyp[0]["tokens"].tolist() == reference_greedy(theirs64, cfg, row, max_len)


def test_converter_refuses_to_overwrite_and_to_convert_a_pre_ln_model(toy_data_bin, tmp_path, capsys):
    source, _, _ = authors_checkpoint(toy_data_bin, tmp_path / "authors.pt")
    existing = tmp_path / "existing.pt"
    existing.write_bytes(b"keep me")
    with pytest.raises(SystemExit) as stop:
        main([str(source), str(existing)])
    assert stop.value.code == 2 and existing.read_bytes() == b"keep me"
    assert capsys.readouterr().err.strip().startswith("error: ")
    # Without the authors' options it is fairseq's own Pre-LN transformer, not a ResiDual model.
    state = torch.load(source, weights_only=True)
    for official in ("enc_res_input_norm_scale", "dec_res_input_norm_scale", "enc_alpha", "dec_alpha"):
        del state["cfg"]["model"][official]
    state["cfg"]["model"]["_name"] = "transformer"
    torch.save(state, tmp_path / "pre_ln.pt")
    with pytest.raises(Exception, match=r"the checkpoint's encoder is Pre-LN \(encoder.normalize_before\)"):
        convert_checkpoint(tmp_path / "pre_ln.pt", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("change, refusal", [
    (lambda a: a.update(enc_alpha="abc"), "the checkpoint's enc_alpha is 'abc', not a finite number"),
    (lambda a: a.update(dec_res_input_norm_scale=[1, 2]), "dec_res_input_norm_scale is '\\[1, 2\\]'"),
    (lambda a: a.update(enc_alpha=float("nan")), "enc_alpha is 'nan', not a finite number"),
    (lambda a: a["encoder"].update(layers=5000), "its config asks for 5000 encoder layers, its weights hold 2"),
])
def test_converter_refuses_hostile_options_in_one_line(toy_data_bin, tmp_path, capsys, change, refusal):
    source, _, _ = authors_checkpoint(toy_data_bin, tmp_path / "authors.pt")
    state = torch.load(source, weights_only=True)
    change(state["cfg"]["model"])
    torch.save(state, source)
    with pytest.raises(SystemExit) as stop:
        main([str(source), str(tmp_path / "out.pt")])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.startswith("error: ") and "\n" not in error
    assert re.search(refusal, error), error
    assert not (tmp_path / "out.pt").exists()


def test_official_option_names_reach_the_model_from_a_hydra_yaml(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({
        "_name": "resi_dual_tiny", "enc_res_input_norm_scale": 0.05, "dec_res_input_norm_scale": 0.1,
        "enc_alpha": 0.5, "dec_alpha": 2.0,
    }))
    vocab = toy_dictionary()
    task = argparse.Namespace(source_dictionary=vocab, target_dictionary=vocab)
    model = models.build_model(OmegaConf.load(tmp_path / "model.yaml"), task)  # fairseq's hydra-path builder
    assert (model.encoder.dual_scale, model.decoder.dual_scale) == (0.05, 0.1)
    assert (model.encoder.main_alpha, model.decoder.main_alpha) == (0.5, 2.0)


def test_official_option_names_on_the_command_line(toy_data_bin):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(toy_data_bin), "--user-dir", USER_DIR, "--arch", "resi_dual_tiny",
        "--enc-res-input-norm-scale", "0.05", "--dec-alpha", "1.5",
    ])
    assert (args.dual_scale_encoder, args.dual_scale_decoder, args.main_alpha_decoder) == (0.05, 1.0, 1.5)


def test_contradicting_names_are_refused_not_silently_merged():
    vocab = toy_dictionary()
    task = argparse.Namespace(source_dictionary=vocab, target_dictionary=vocab)
    cfg = OmegaConf.create({"_name": "resi_dual_tiny", "enc_res_input_norm_scale": 0.05, "dual_scale_encoder": 0.5})
    with pytest.raises(ValueError, match="enc_res_input_norm_scale=0.05 contradicts dual_scale_encoder=0.5"):
        models.build_model(cfg, task)


@pytest.mark.slow
def test_convert_cli_runs_as_a_console_script(toy_data_bin, tmp_path):
    source, _, _ = authors_checkpoint(toy_data_bin, tmp_path / "authors.pt", s_enc=0.5)
    proc = run(["residual-fairseq-convert", source, tmp_path / "out.pt"])
    assert "dual_scale_encoder=0.5" in proc.stdout and (tmp_path / "out.pt").is_file()


def test_a_directory_is_refused_naming_a_checkpoint_file_to_give(tmp_path, capsys):
    """The loader's message for a directory named average-checkpoints' --num-epoch-checkpoints,
    which convert does not have."""
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "run"), str(tmp_path / "out.pt")])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'run'} is a directory: convert takes one checkpoint file, "
                                       f"e.g. {tmp_path / 'run' / 'checkpoint_best.pt'}\n")
    assert not (tmp_path / "out.pt").exists()


# --- the flat command line: two names of one option -------------------------------------------

def _parse(toy_data_bin, *flags):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, [str(toy_data_bin), "--user-dir", USER_DIR,
                                                "--arch", "resi_dual_tiny", *flags])


@pytest.mark.parametrize("flags, refused", [
    (["--dual-scale-encoder", "0.5", "--enc-res-input-norm-scale", "0.05"],
     "argument --enc-res-input-norm-scale: 0.05 contradicts --dual-scale-encoder 0.5"),
    (["--enc-res-input-norm-scale", "0.05", "--dual-scale-encoder", "0.5"],
     "argument --dual-scale-encoder: 0.5 contradicts --enc-res-input-norm-scale 0.05"),
    (["--main-alpha-decoder=2", "--dec-alpha=1.5"], "argument --dec-alpha: 1.5 contradicts --main-alpha-decoder 2"),
])
def test_both_names_with_different_values_are_refused_in_either_order(toy_data_bin, capsys, flags, refused):
    """fairseq's own parser (fairseq-train's): one error line, exit 2, whichever name comes last."""
    with pytest.raises(SystemExit) as stop:
        _parse(toy_data_bin, *flags)
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"error: " + re.escape(refused) + r", the other name of the same option", last), last


def test_both_names_with_the_same_value_are_one_option(toy_data_bin):
    args = _parse(toy_data_bin, "--dual-scale-encoder", "0.5", "--enc-res-input-norm-scale", "0.5",
                  "--dec-alpha", "2", "--dec-alpha", "3")  # one name twice: the last wins, as in argparse
    assert (args.dual_scale_encoder, args.main_alpha_decoder) == (0.5, 3.0)
    # The stored options hold each value once, under this plugin's name.
    assert not hasattr(args, "enc_res_input_norm_scale") and not hasattr(args, "dec_alpha")


@pytest.mark.slow
def test_fairseq_train_refuses_both_names_with_different_values(toy_data_bin, tmp_path):
    for flags in (["--dual-scale-encoder", "0.5", "--enc-res-input-norm-scale", "0.05"],
                  ["--enc-res-input-norm-scale", "0.05", "--dual-scale-encoder", "0.5"]):
        proc = run([fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, "--arch", "resi_dual_tiny",
                    "--cpu", "--save-dir", tmp_path / "ck", *flags], check=False)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "contradicts" in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "ck").exists()


# --- the authors' hydra yamls with this plugin ------------------------------------------------

OVERRIDE = "override with model.encoder.normalize_before=false model.decoder.normalize_before=false"


def test_authors_yaml_model_is_refused_with_the_override_and_builds_with_it(tmp_path):
    """Their yamls set model.encoder/decoder.normalize_before: true, which their layers never read.
    Here it would mean Pre-LN layers, which resi_dual does not have: one line names the override."""
    vocab = toy_dictionary()
    task = argparse.Namespace(source_dictionary=vocab, target_dictionary=vocab)
    section = authors_model_section(s_enc=0.05, s_dec=0.1, a_enc=1.0, a_dec=1.0, dim=256, ffn=1024, layers=6)
    with pytest.raises(ValueError) as refusal:
        models.build_model(OmegaConf.create(section), task)  # fairseq's hydra-path builder
    message = str(refusal.value)
    assert "\n" not in message and message.startswith(
        "model.encoder.normalize_before and model.decoder.normalize_before are true, which does not apply to resi_dual")
    assert OVERRIDE in message
    section["encoder"]["normalize_before"] = section["decoder"]["normalize_before"] = False  # the override
    model = models.build_model(OmegaConf.create(section), task)
    assert (model.encoder.dual_scale, model.decoder.dual_scale) == (0.05, 0.1)
    assert len(model.encoder.layers) == 6 and model.encoder.embed_tokens.embedding_dim == 256


@pytest.mark.slow
def test_fairseq_hydra_train_with_an_authors_style_yaml_names_the_override(toy_data_bin, tmp_path):
    config = {
        "model": authors_model_section(),
        "task": {"_name": "translation", "data": str(toy_data_bin), "source_lang": "src", "target_lang": "tgt"},
        "criterion": {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1},
        "optimizer": {"_name": "adam"}, "lr_scheduler": {"_name": "inverse_sqrt", "warmup_updates": 10},
        "optimization": {"lr": [0.0005], "max_update": 1},
        "dataset": {"max_tokens": 500, "num_workers": 0},
        "common": {"cpu": True, "user_dir": USER_DIR, "log_format": "simple"},
        "checkpoint": {"save_dir": str(tmp_path / "ckpt")},
    }
    (tmp_path / "iwslt_style.yaml").write_text(yaml.safe_dump(config))
    command = [fairseq_cli("fairseq-hydra-train"), "--config-dir", tmp_path, "--config-name", "iwslt_style"]
    proc = run(command, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # hydra's own "Error executing job" line, then the message (as for its config errors).
    assert re.search(r"^Error executing job with overrides: \[\]\nmodel\.encoder\.normalize_before and "
                     r"model\.decoder\.normalize_before are true, which does not apply to resi_dual .*"
                     + re.escape(OVERRIDE), proc.stderr, re.M), proc.stderr[-3000:]
    assert not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()
