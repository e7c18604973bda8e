"""A checkpoint is untrusted input (docs/reliability.md#untrusted-checkpoints).

A catalogue of crafted checkpoints, all derived from one tiny real checkpoint, fed to
every loader: the project's CLIs (in-process, so a traceback fails the test), the
Python API, fairseq-generate / fairseq-interactive with ``--user-dir``, and hub
``from_pretrained``. No payload may run (its marker file never appears), every CLI
exits 2 with exactly one ``error:`` line, and nothing is written. Plus the train
driver: resume ignores averaged checkpoints, a killed driver takes its fairseq-train
with it, and a second driver on a save dir in use is refused.
"""
import argparse
import copy
import io
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import residual_fairseq
from fairseq import checkpoint_utils, options, utils
from helpers import CLI_ENV, TINY_TRAIN_ARGS, USER_DIR, fairseq_cli, run, user_error
from residual_fairseq import analysis, average_checkpoints, checkpoints, evaluate, fairseq_patches, finetune, train, translate
from residual_fairseq.checkpoints import EVALUATED_FIELDS, CodeInConfigError, literal_value
from residual_fairseq.errors import UserError
from residual_fairseq.checkpoints.types import check_config_types
from residual_fairseq.models import ResiDualModel



@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    path = tmp_path_factory.mktemp("payload") / "payload-ran"
    yield path
    assert not path.exists(), "a payload ran"


def payload(marker):
    """A config string whose eval() creates the marker file (and still looks like a cutoff list)."""
    return f"__import__('os').system('touch {marker}') or [100]"


class RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def real(toy_data_bin, tmp_path_factory):
    """One tiny real checkpoint (fairseq-train, 1 update), the parent of every crafted one."""
    save_dir = tmp_path_factory.mktemp("real")
    run([fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
         "--max-update", "1", "--save-dir", save_dir, "--no-save-optimizer-state", "--no-epoch-checkpoints"])
    return save_dir / "checkpoint_last.pt"


def args_layout(state):
    """The same checkpoint in the older layout: the flat training arguments in ``args``."""
    state = copy.deepcopy(state)
    state["args"] = copy.deepcopy(state["cfg"]["model"])
    del state["cfg"]
    return state


def with_model_options(state, **options):
    state = copy.deepcopy(state)
    config = state["args"] if state.get("args") is not None else state["cfg"]["model"]
    for name, value in options.items():
        setattr(config, name, value)
    return state


def rewrite_zip(source: bytes, change) -> bytes:
    """A copy of a zip archive with ``change(name, data) -> (name, data) or None`` applied per record."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(source)) as old, zipfile.ZipFile(out, "w") as new:
        for info in old.infolist():
            changed = change(info.filename, old.read(info.filename))
            if changed is not None:
                new.writestr(changed[0], changed[1])
    return out.getvalue()


def pickled_key(key: str) -> bytes:
    return b"X" + len(key).to_bytes(4, "little") + key.encode()  # protocol-2 BINUNICODE


@pytest.fixture(scope="module")
def catalogue(real, marker, tmp_path_factory):
    """name -> (crafted checkpoint file, what its one-line error says)."""
    out = tmp_path_factory.mktemp("crafted")
    good = torch.load(real, weights_only=True)
    files = {}

    def save(name, state, expected, **kwargs):
        torch.save(state, out / f"{name}.pt", **kwargs)
        files[name] = (out / f"{name}.pt", expected)

    def write(name, data, expected):
        (out / f"{name}.pt").write_bytes(data)
        files[name] = (out / f"{name}.pt", expected)

    code = payload(marker)
    refused_string = "refusing to evaluate config string"
    # config strings fairseq would eval(), in both layouts and several fields / code paths
    save("cfg_adaptive_softmax_cutoff", with_model_options(good, adaptive_softmax_cutoff=code),
         "cfg.model.adaptive_softmax_cutoff: " + refused_string)
    save("cfg_fconv_encoder_layers", with_model_options(good, arch="fconv", _name="fconv", encoder_layers=code,
                                                        decoder_layers=code),
         r"cfg.model.(en|de)coder_layers: " + refused_string)
    save("cfg_lstm_decoder_attention", with_model_options(good, arch="lstm", _name="lstm", decoder_attention=code,
                                                          decoder_out_embed_dim=good["cfg"]["model"].decoder_embed_dim),
         "cfg.model.decoder_attention: " + refused_string)
    task_injected = copy.deepcopy(good)
    task_injected["cfg"]["task"]["left_pad_source"] = f"__import__('os').system('touch {marker}') == 0"
    save("cfg_task_left_pad_source", task_injected, "cfg.task.left_pad_source: " + refused_string)
    save("args_adaptive_softmax_cutoff", with_model_options(args_layout(good), adaptive_softmax_cutoff=code),
         "args.adaptive_softmax_cutoff: " + refused_string)
    save("args_fconv_decoder_layers", with_model_options(args_layout(good), arch="fconv", decoder_layers=code,
                                                         encoder_layers=code),
         r"args.(en|de)coder_layers: " + refused_string)
    save("args_xformers_att_config", with_model_options(args_layout(good), encoder_xformers_att_config=code),
         "args.encoder_xformers_att_config: " + refused_string)
    interpolated = copy.deepcopy(good)
    interpolated["cfg"]["common"]["log_format"] = "${oc.env:HOME}"
    save("cfg_interpolation", interpolated, "cfg.common.log_format is an omegaconf interpolation")

    # config values that would make a loader open a pipe (blocks forever) or download a URL
    pipe = out / "a-pipe"
    os.mkfifo(pipe)
    bpe_pipe = copy.deepcopy(good)
    bpe_pipe["cfg"]["bpe"] = {"_name": "sentencepiece", "sentencepiece_model": str(pipe)}
    save("cfg_bpe_names_a_pipe", bpe_pipe, "cfg.bpe.sentencepiece_model names .* which is not a regular file")
    bpe_url = copy.deepcopy(good)
    bpe_url["cfg"]["bpe"] = {"_name": "gpt2", "gpt2_encoder_json": "http://127.0.0.1:9/encoder.json",
                             "gpt2_vocab_bpe": "http://127.0.0.1:9/vocab.bpe"}
    save("cfg_bpe_names_a_url", bpe_url, "cfg.bpe.gpt2_encoder_json names a URL")
    save("args_bpe_names_a_url", with_model_options(args_layout(good), bpe="subword_nmt",
                                                    bpe_codes="https://example.com/codes"),
         "args.bpe_codes names a URL")
    # nesting deeper than any config (omegaconf and torch.save recurse once per level)
    deep = []
    for _ in range(40):
        deep = [deep]
    nested_cfg = copy.deepcopy(good)
    nested_cfg["cfg"]["common"]["deep"] = deep
    save("cfg_nested_too_deep", nested_cfg, "cfg is nested more than 32 levels deep")
    nested_extra = copy.deepcopy(good)
    nested_extra["extra_state"]["deep"] = deep
    save("extra_state_nested_too_deep", nested_extra, "extra_state is nested more than 32 levels deep")

    # without token embeddings the config's sizes cannot be checked: here an FFN of 2**17 units
    no_embeddings = with_model_options(good, encoder_ffn_embed_dim=2 ** 17, decoder_ffn_embed_dim=2 ** 17)
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        no_embeddings["model"].pop(name, None)
    save("no_token_embeddings", no_embeddings, "holds no decoder.embed_tokens.weight")

    # config values of another type than fairseq's config dataclasses declare: fairseq took them
    # (a TypeError while decoding, fairseq-generate aborting with -6)
    save("cfg_model_dropout_a_string", with_model_options(good, dropout="abc"),
         re.escape("stores cfg.model.dropout = 'abc', not a number"))
    save("args_dropout_a_string", with_model_options(args_layout(good), dropout="abc"),
         re.escape("stores args.dropout = 'abc', not a number"))
    wrong_section = copy.deepcopy(good)
    wrong_section["cfg"]["criterion"]["label_smoothing"] = "0.1"
    save("cfg_criterion_a_string", wrong_section, re.escape("stores cfg.criterion.label_smoothing = '0.1', not a number"))

    # pickle payloads
    reduce_payload = copy.deepcopy(good)
    reduce_payload["extra_state"]["metrics"] = RunsCodeWhenUnpickled(marker)
    save("pickle_reduce", reduce_payload, r"it would import (posix|os)\.system")
    numpy_payload = copy.deepcopy(good)
    numpy_payload["extra_state"]["metrics"] = np.array([RunsCodeWhenUnpickled(marker)], dtype=object)
    save("pickle_numpy_object_array", numpy_payload, "refusing to load checkpoint")
    save("pickle_legacy_format", reduce_payload, "not a torch checkpoint file", _use_new_zipfile_serialization=False)

    # malformed layouts
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("hello.txt", "not a checkpoint")
    write("zip_not_torch", zipped.getvalue(), "not a torch checkpoint file")
    write("truncated", real.read_bytes()[: real.stat().st_size // 2], "is truncated")
    save("empty_dict", {}, "no 'model' entry")
    save("a_list", [good["model"]], "it holds a list, not a dict")
    save("no_model", {k: v for k, v in good.items() if k != "model"}, "no 'model' entry")
    save("model_a_list", {**good, "model": list(good["model"].values())}, "'model' is a list")
    save("unexpected_entry", {**good, "exploit": {"run": "me"}}, "unexpected entries exploit")
    save("cfg_a_string", {**good, "cfg": "model=resi_dual"}, "'cfg' is a str, not a dict")
    save("args_a_dict", {**good, "cfg": None, "args": {"arch": "resi_dual_tiny"}},
         "'args' is a dict, not an argparse.Namespace")
    save("cfg_model_a_list", {**good, "cfg": {**good["cfg"], "model": ["resi_dual"]}}, "cfg.model is a list")
    small = {"model": {"w": torch.zeros(4)}}  # the storage key "0" is the only "0" in its pickle
    torch.save(small, out / "small.pt")
    small_bytes = (out / "small.pt").read_bytes()
    write("storage_key_dotdot", rewrite_zip(small_bytes, lambda name, data: (
        name, data.replace(pickled_key("0"), pickled_key("../0"), 1) if name.endswith("data.pkl") else data)),
        "storage key '../0' is not a plain name")
    write("record_name_dotdot", rewrite_zip(small_bytes, lambda name, data: (
        name.replace("/data/0", "/data/../../0"), data)), "unexpected record name")
    write("storage_record_short", rewrite_zip(small_bytes, lambda name, data: (
        name, data[:4] if name.endswith("/data/0") else data)), "declares 16 bytes but its record holds 4")

    # a record that the zip's directory declares longer than the file holds
    data = bytearray(real.read_bytes())
    entry = data.rindex(b"PK\x01\x02")  # the last entry of the zip's central directory
    data[entry + 20:entry + 28] = (2 ** 31).to_bytes(4, "little") * 2  # compressed and uncompressed size
    write("record_past_the_end", bytes(data), "ends past the end of the file")

    # declared-size bombs
    save("bomb_stride_zero", {**good, "model": {"w": torch.zeros(1).expand(10**7, 10**6)}},
         "does not fit")
    shared = torch.zeros(2**18)
    save("bomb_many_views", {**good, "model": {f"w{i}": shared for i in range(64)}}, "a memory bomb")
    return files


@pytest.fixture(scope="module")
def one_line(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "one_line.txt"
    path.write_text("w1 w2 w3\n")
    return path


def files_under(directory):
    return sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*")) if Path(directory).exists() else []


def project_clis(path, good, data_bin, one_line, out):
    """(name, main, argv) of every project CLI that opens ``path``, writing only under ``out``."""
    save_dir = out / "train"
    save_dir.mkdir(parents=True)
    (save_dir / "checkpoint_last.pt").write_bytes(Path(path).read_bytes())
    return [
        ("translate", translate.main, [path, "--data", data_bin, "--input", one_line]),
        ("evaluate", evaluate.main, [path, data_bin, "--out-json", out / "eval.json"]),
        ("analyze", analysis.main, [data_bin, "--out", out / "analysis", "--checkpoint", f"x={path}",
                                    "--batches", "1"]),
        ("average-checkpoints", average_checkpoints.main, ["--inputs", good, path, "--output", out / "avg.pt"]),
        ("finetune", finetune.main, ["--checkpoint", path, "--dataset", "sample-es-en", "-s", "en", "-t", "es",
                                     "--data-out", out / "ft-data", "--save-dir", out / "ft-save",
                                     "--train-config", "sample-es-en", "resi_dual", "3", "--vocab-from", out / "v"]),
        ("train (resume)", train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3",
                                        "--data", data_bin, "--save-dir", save_dir]),
    ]


CASES = [
    "cfg_adaptive_softmax_cutoff", "cfg_fconv_encoder_layers", "cfg_lstm_decoder_attention",
    "cfg_task_left_pad_source", "args_adaptive_softmax_cutoff", "args_fconv_decoder_layers",
    "args_xformers_att_config", "cfg_interpolation", "cfg_bpe_names_a_pipe", "cfg_bpe_names_a_url",
    "args_bpe_names_a_url", "cfg_nested_too_deep", "extra_state_nested_too_deep", "no_token_embeddings",
    "pickle_reduce", "pickle_numpy_object_array",
    "pickle_legacy_format", "zip_not_torch", "truncated", "empty_dict", "a_list", "no_model", "model_a_list",
    "unexpected_entry", "cfg_a_string", "args_a_dict", "cfg_model_a_list", "storage_key_dotdot",
    "record_name_dotdot", "storage_record_short", "bomb_stride_zero", "bomb_many_views",
    "cfg_model_dropout_a_string", "args_dropout_a_string", "cfg_criterion_a_string", "record_past_the_end",
]


@pytest.mark.parametrize("case", CASES)
def test_every_project_loader_refuses_in_one_line(case, catalogue, real, toy_data_bin, one_line, marker, capsys,
                                                  tmp_path):
    path, expected = catalogue[case]
    api_messages = set()
    for loader in (lambda: translate.load_translator(path, toy_data_bin),
                   lambda: checkpoints.read_checkpoint(path),
                   lambda: average_checkpoints.average_checkpoints([str(real), str(path)]),
                   lambda: finetune.embedding_rows(path),
                   lambda: analysis.load_checkpoint(path, translate_task(toy_data_bin))):
        with pytest.raises(UserError) as refused:
            loader()
        assert re.search(expected, str(refused.value)), str(refused.value)
        api_messages.add(str(refused.value))

    for name, main, argv in project_clis(path, real, toy_data_bin, one_line, tmp_path / "out"):
        before = files_under(tmp_path / "out")
        line = user_error(capsys, main, argv, only_line=True)
        assert re.search(expected, line), (name, line)
        if name != "train (resume)":
            assert line[len("error: "):] in api_messages, (name, line)  # the API raises the CLI's message
        after = [f for f in files_under(tmp_path / "out") if not f.endswith(train.LOCK_NAME)]
        assert after == before, (name, "wrote", set(after) - set(before))
        assert not marker.exists(), name


_tasks = {}


def translate_task(data_bin):
    if data_bin not in _tasks:
        from residual_fairseq.fairseq_data import load_task

        _tasks[data_bin] = load_task(data_bin, None, None)
    return _tasks[data_bin]


@pytest.mark.parametrize("case", CASES)
def test_hub_from_pretrained_refuses(case, catalogue, toy_data_bin, marker):
    from fairseq.models.transformer import TransformerModel

    path, expected = catalogue[case]
    for model_class in (ResiDualModel, TransformerModel):
        with pytest.raises(checkpoints.CheckpointError, match=expected):
            model_class.from_pretrained(str(path.parent), checkpoint_file=path.name,
                                        data_name_or_path=str(toy_data_bin))
    assert not marker.exists()


def test_a_colon_in_a_path_names_one_file(catalogue, real, toy_data_bin, one_line, marker, tmp_path, capsys):
    """fairseq splits paths on ':' into ensembles; the project's tools never do."""
    (tmp_path / "a").write_bytes(catalogue["cfg_adaptive_softmax_cutoff"][0].read_bytes())
    (tmp_path / "b.pt").write_bytes(real.read_bytes())
    colon = tmp_path / "a:b.pt"
    colon.write_bytes(real.read_bytes())
    translate.main([str(colon), "--data", str(toy_data_bin), "--input", str(one_line), "--beam", "1"])
    assert capsys.readouterr().out.strip()
    assert translate.load_translator(colon, toy_data_bin).translate("w1 w2", beam=1) is not None
    with evaluate.unsplittable_path(colon) as name:
        assert ":" not in str(name) and Path(name).resolve() == colon.resolve()
    # hub from_pretrained keeps fairseq's ensemble syntax, and every member is checked
    with pytest.raises(checkpoints.CheckpointError, match="adaptive_softmax_cutoff"):
        ResiDualModel.from_pretrained(str(tmp_path), checkpoint_file="a:b.pt", data_name_or_path=str(toy_data_bin))
    assert not marker.exists()


def test_fairseq_clis_with_the_plugin_refuse(catalogue, real, toy_data_bin, marker):
    """fairseq-generate / fairseq-interactive --user-dir: the plugin guards fairseq's own loader,
    and the refusal is one ``error:`` line (exit 1), not a traceback."""
    generate = [fairseq_cli("fairseq-generate"), toy_data_bin, "--user-dir", USER_DIR, "--cpu",
                "--max-tokens", "100", "--max-len-b", "5"]
    interactive = [fairseq_cli("fairseq-interactive"), toy_data_bin, "--user-dir", USER_DIR, "--cpu",
                   "--max-len-b", "5"]
    # Two runs (each ~5 s of imports): the other kinds go through the same guarded loader,
    # which the in-process hub test feeds the whole catalogue.
    runs = {
        "generate ensemble, cfg injection 2nd": generate + [
            "--path", f"{real}:{catalogue['cfg_adaptive_softmax_cutoff'][0]}"],
        "interactive args injection": interactive + ["--path", catalogue["args_adaptive_softmax_cutoff"][0]],
    }
    expected = {
        "generate ensemble, cfg injection 2nd": "cfg.model.adaptive_softmax_cutoff: refusing to evaluate",
        "interactive args injection": "args.adaptive_softmax_cutoff: refusing to evaluate",
    }
    processes = {name: subprocess.Popen([str(c) for c in cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=CLI_ENV)
                 for name, cmd in runs.items()}
    for name, process in processes.items():
        out, err = process.communicate("w1 w2\n", timeout=300)
        assert process.returncode == 1, name  # fairseq's CLI owns its exit status
        # One line, not a traceback through fairseq (fairseq_patches.report_user_errors_in_fairseq_commands).
        assert re.search(r"^error: .*" + expected[name] + ".*\\Z", err.strip(), re.M), (name, err[-2000:])
        assert "Traceback" not in err, (name, err[-2000:])
        assert not re.search(r"^[HS]-\d", out, re.M), name
    assert not marker.exists()


def test_the_eval_calls_of_fairseq_take_literals_only(catalogue, toy_data_bin, marker):
    """The second line of defence, alone: fairseq's own loader (our checks bypassed)
    builds the model, and fairseq's eval() calls refuse code."""
    import fairseq.models.fconv

    code = payload(marker)
    for evaluate_string in (lambda: utils.eval_str_list(code, type=int), lambda: options.eval_str_list(code),
                            lambda: utils.eval_bool(code), lambda: utils.eval_str_dict(code),
                            lambda: fairseq.models.fconv.eval(code)):
        with pytest.raises(CodeInConfigError):
            evaluate_string()
    for name in ("cfg_adaptive_softmax_cutoff", "args_fconv_decoder_layers", "cfg_lstm_decoder_attention"):
        state = fairseq_patches._fairseq_load_checkpoint_to_cpu(str(catalogue[name][0]),
                                                                 arg_overrides={"data": str(toy_data_bin)})
        with pytest.raises(CodeInConfigError):
            checkpoint_utils.load_model_ensemble_and_task([str(catalogue[name][0])], state=state)
    assert not marker.exists()


def test_legitimate_config_strings_keep_their_meaning():
    """Every string default fairseq gives an evaluated option (all registered
    architectures), and the documented forms, evaluate as the builtin eval() does."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    assert utils.eval_str_list("1000,5000", type=int) == [1000, 5000]
    assert utils.eval_str_list("[1000, 5000]", type=int) == [1000, 5000]
    assert options.eval_str_list("(0.9, 0.98)") == [0.9, 0.98]
    assert utils.eval_bool("True") is True and utils.eval_bool("False") is False and utils.eval_bool(None) is False
    assert utils.eval_str_dict("{'a': 1}") == {"a": 1}
    defaults = set()
    for arch, set_defaults in ARCH_CONFIG_REGISTRY.items():
        args = argparse.Namespace()
        try:
            set_defaults(args)
        except Exception:  # noqa: BLE001  (some presets need options set first)
            continue
        defaults |= {getattr(args, f) for f in EVALUATED_FIELDS if isinstance(getattr(args, f, None), str)}
    assert "[(512, 3)] * 20" in defaults and len(defaults) > 10
    for text in defaults:
        assert literal_value(text) == eval(text), text  # trusted strings: fairseq's own defaults


def test_legitimate_checkpoints_load_in_both_layouts(real, tmp_path, toy_data_bin):
    good = torch.load(real, weights_only=True)
    torch.save(args_layout(good), tmp_path / "args_layout.pt")
    for path in (real, tmp_path / "args_layout.pt"):
        translator = translate.load_translator(path, toy_data_bin)
        assert isinstance(translator.translate("w1 w2", beam=1, max_len_b=3), str)
    averaged = tmp_path / "avg.pt"
    average_checkpoints.main(["--inputs", str(real), str(real), "--output", str(averaged)])
    assert checkpoints.read_checkpoint(averaged)["model"].keys() == good["model"].keys()



# Options set in a checkpoint's config that fairseq would build before any weight is
# compared. In the wild they ask for hundreds of GB; here they are bounded (a few
# hundred MB), so that a broken check fails the test instead of the machine.
CONFIG_BOMBS = [
    ("encoder_ffn_embed_dim", 1 << 20,
     r"its config makes encoder\.layers\.0\.fc1\.weight \[1048576, \d+\], its weights hold \[\d+, \d+\]"),
    ("decoder_layers", 300, "its config asks for 300 decoder layers, its weights hold 2"),
    # sinusoidal positions: a table the stored weights never hold
    ("max_source_positions", 1 << 21, "its config asks for a model of [0-9,]+ values, its weights hold [0-9,]+"),
]


@pytest.mark.parametrize("layout", ["cfg", "args"])
@pytest.mark.parametrize("option, value, refusal", CONFIG_BOMBS, ids=[bomb[0] for bomb in CONFIG_BOMBS])
def test_a_config_asking_for_more_than_its_weights_is_refused_before_building(
        layout, option, value, refusal, real, toy_data_bin, tmp_path):
    good = torch.load(real, weights_only=True)
    state = with_model_options(good if layout == "cfg" else args_layout(good), **{option: value})
    torch.save(state, tmp_path / "bomb.pt")
    path = tmp_path / "bomb.pt"
    for loader in (lambda: translate.load_translator(path, toy_data_bin),
                   lambda: analysis.load_checkpoint(path, translate_task(toy_data_bin)),
                   lambda: ResiDualModel.from_pretrained(str(tmp_path), checkpoint_file="bomb.pt",
                                                         data_name_or_path=str(toy_data_bin))):
        with pytest.raises(checkpoints.CheckpointError, match=refusal):
            loader()



@pytest.mark.parametrize("arch, sizes", [
    # lstm keeps its layers as encoder.lstm.weight_ih_l0, not encoder.layers.N
    ("lstm", dict(encoder_embed_dim=16, decoder_embed_dim=16, encoder_hidden_size=16, decoder_hidden_size=16,
                  decoder_out_embed_dim=16)),
    ("fconv", dict(encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16,
                   encoder_layers="[(16, 3)] * 2", decoder_layers="[(16, 3)] * 2")),
    ("transformer", dict(encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
                         decoder_ffn_embed_dim=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                         decoder_attention_heads=2, adaptive_softmax_cutoff="5,10", encoder_learned_pos=True)),
])
def test_the_config_size_check_passes_fairseqs_own_architectures(arch, sizes):
    """The check runs in fairseq-generate / resume for every model: it must not refuse
    a legitimate checkpoint of an architecture that names its layers otherwise."""
    from fairseq import models
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from residual_fairseq.variants import toy_dictionary

    vocabulary = toy_dictionary()
    args = argparse.Namespace(arch=arch, task="translation", criterion="cross_entropy", max_source_positions=64,
                              max_target_positions=64, **sizes)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = models.build_model(argparse.Namespace(**vars(args)),
                               argparse.Namespace(source_dictionary=vocabulary, target_dictionary=vocabulary))
    checkpoints.check_config_fits_weights({"args": args, "model": model.state_dict()}, arch)
    check_config_types({"args": args}, arch, arch)  # fairseq's own values have their declared types
    # ... while a config asking for more still fails, for these architectures too
    with pytest.raises(checkpoints.CheckpointError, match="its config"):
        bigger = dict(vars(args), decoder_embed_dim=64, decoder_out_embed_dim=64)
        checkpoints.check_config_fits_weights({"args": argparse.Namespace(**bigger),
                                                    "model": model.state_dict()}, arch)

def test_a_checkpoint_never_opens_the_files_its_initialisation_read(real, toy_data_bin, tmp_path):
    """Pretrained-embedding paths are for a new model; a checkpoint's own weights replace
    them, so a path in its config (/dev/zero in an attack; a missing file and a
    malformed one here, either of which fairseq would fail on) is never opened."""
    good = torch.load(real, weights_only=True)
    reference = translate.load_translator(real, toy_data_bin).translate("w1 w2 w3", beam=2, max_len_b=4)
    (tmp_path / "malformed.vec").write_text("not an embedding file\n")
    for layout in (good, args_layout(good)):
        torch.save(with_model_options(layout, encoder_embed_path=str(tmp_path / "missing.vec"),
                                      decoder_embed_path=str(tmp_path / "malformed.vec")), tmp_path / "named.pt")
        translator = translate.load_translator(tmp_path / "named.pt", toy_data_bin)
        assert translator.translate("w1 w2 w3", beam=2, max_len_b=4) == reference

def test_averaging_refuses_checkpoints_of_different_models(real, tmp_path, capsys):
    good = torch.load(real, weights_only=True)
    name = next(iter(good["model"]))
    variants = {
        "shape": {**good, "model": {**good["model"], name: torch.zeros(3, 3)}},
        "dtype": {**good, "model": {**good["model"], name: good["model"][name].double()}},
        "keys": {**good, "model": {k: v for k, v in good["model"].items() if k != name}},
    }
    for kind, state in variants.items():
        torch.save(state, tmp_path / f"{kind}.pt")
        line = user_error(capsys, average_checkpoints.main, ["--inputs", str(real), str(tmp_path / f"{kind}.pt"),
                                                             "--output", str(tmp_path / "avg.pt")], only_line=True)
        assert "not the same model" in line and name in line, line
    # Same shapes, different models: another residual scheme, another scale of the dual
    # stream, another architecture name, another language pair (both stored).
    def with_pair(state, source):
        return {**state, "cfg": {**state["cfg"], "task": {**state["cfg"]["task"], "source_lang": source,
                                                         "target_lang": "tgt"}}}

    torch.save(with_pair(good, "src"), tmp_path / "paired.pt")
    definitions = {
        "encoder_normalize_before": (real, with_model_options(good, encoder_normalize_before=True)),
        "dual_scale_decoder": (real, with_model_options(good, dual_scale_decoder=0.05)),
        "architecture": (real, with_model_options(args_layout(good), arch="transformer_tiny")),
        "source language": (tmp_path / "paired.pt", with_pair(good, "de")),
    }
    for option, (first, state) in definitions.items():
        torch.save(state, tmp_path / "other.pt")
        line = user_error(capsys, average_checkpoints.main, ["--inputs", str(first), str(tmp_path / "other.pt"),
                                                             "--output", str(tmp_path / "avg.pt")], only_line=True)
        assert f"are different models: {option} " in line, line
    assert not (tmp_path / "avg.pt").exists()
    # The same model in the older layout (args) averages with it, and so does one whose
    # config lacks an option the other stores (an older version wrote it; it loads with the default).
    older = args_layout(good)
    del older["args"].cross_self_attention
    torch.save(older, tmp_path / "args.pt")
    average_checkpoints.main(["--inputs", str(real), str(tmp_path / "args.pt"), "--output", str(tmp_path / "avg.pt")])
    assert (tmp_path / "avg.pt").is_file()
    for argv, refusal in ((["--num-epoch-checkpoints", "0"], "must be at least 1"),
                          (["--checkpoint-upper-bound", "3"], "--checkpoint-upper-bound needs --num-epoch-checkpoints")):
        line = user_error(capsys, average_checkpoints.main, ["--inputs", str(real), str(real), "--output",
                                                             str(tmp_path / "avg2.pt"), *argv])
        assert refusal in line, line


# --- the train driver -------------------------------------------------------------------------


def test_resume_ignores_averaged_and_foreign_checkpoints(real, catalogue, tmp_path):
    data = real.read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(data[: len(data) // 3])  # a crash during fairseq's copy
    (tmp_path / "checkpoint_2_10.pt").write_bytes(data)
    os.utime(tmp_path / "checkpoint_2_10.pt", (1, 1))  # the oldest: every other candidate is newer
    for name in ("checkpoint.avg_last2_updates.pt", "checkpoint.avg5.pt", "checkpoint_mine.pt", "checkpoint3.pt.bak"):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "checkpoint7.pt").write_bytes(catalogue["pickle_reduce"][0].read_bytes())  # newer, but unsafe
    note, _ = train.resume_point(tmp_path)
    assert f"resuming from {tmp_path / 'checkpoint_2_10.pt'}" in note and "was truncated" in note
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == data

    only_averaged = tmp_path / "only_averaged"
    only_averaged.mkdir()
    (only_averaged / "checkpoint_last.pt").write_bytes(data[:1000])
    (only_averaged / "checkpoint.avg_last2_updates.pt").write_bytes(data)
    with pytest.raises(UserError, match="no intact checkpoint of the run"):
        train.resume_point(only_averaged)
    assert train.resume_point(tmp_path)[0] == f"resuming from {tmp_path / 'checkpoint_last.pt'} (epoch 1, 1 updates)"


def test_a_second_driver_on_a_save_dir_in_use_is_refused(toy_data_bin, tmp_path, capsys):
    save_dir = tmp_path / "ck"
    argv = ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3", "--data", toy_data_bin,
            "--save-dir", save_dir]
    with train.save_dir_lock(save_dir):
        line = user_error(capsys, train.main, argv, only_line=True)
    assert f"{save_dir} is in use by another training run (pid {os.getpid()}" in line
    assert files_under(save_dir) == [train.LOCK_NAME]


def processes_in_group(pgid):
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def children_of(pid):
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_killing_the_driver_ends_fairseq_train(toy_data_bin, tmp_path):
    drivers = {}
    for signum in (signal.SIGKILL, signal.SIGTERM):
        save_dir = tmp_path / signum.name
        drivers[signum] = (save_dir, subprocess.Popen(
            [sys.executable, "-m", "residual_fairseq.train", "--dataset", "sample-es-en", "--variant", "resi_dual",
             "--layers", "3", "--data", str(toy_data_bin), "--save-dir", str(save_dir), "--", "--max-epoch", "1000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CLI_ENV))
    children = {}
    deadline = time.monotonic() + 120
    while len(children) < len(drivers) and time.monotonic() < deadline:
        for signum, (_, driver) in drivers.items():
            assert driver.poll() is None, f"the driver ended early ({driver.returncode})"
            if signum not in children and children_of(driver.pid):
                children[signum] = children_of(driver.pid)
        time.sleep(0.2)
    assert len(children) == len(drivers), "fairseq-train never started"
    for signum, (_, driver) in drivers.items():
        driver.send_signal(signum)
    for signum, (save_dir, driver) in drivers.items():
        assert driver.wait(timeout=60) == -signum
        deadline = time.monotonic() + 30
        while any(processes_in_group(child) for child in children[signum]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(processes_in_group(child) for child in children[signum]), f"orphans after {signum.name}"
        with train.save_dir_lock(save_dir):  # released by the dead driver and its dead children
            pass


@pytest.mark.parametrize("kind", ["pipe", "device", "link to a device"])
def test_a_checkpoint_that_is_no_regular_file_is_refused_without_reading(kind, tmp_path, capsys, toy_data_bin,
                                                                          one_line):
    """A named pipe would block every reader forever, /dev/zero never end (or fill the memory)."""
    path = tmp_path / "checkpoint_last.pt"
    if kind == "pipe":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path.symlink_to("/dev/zero")
    for check in (checkpoints.read_checkpoint, checkpoints.is_intact):
        with pytest.raises(checkpoints.CheckpointError, match="is not a regular file"):
            check(path)
    line = user_error(capsys, translate.main, [path, "--data", toy_data_bin, "--input", one_line], only_line=True)
    assert line == f"error: checkpoint {path} is not a regular file"
    line = user_error(capsys, evaluate.main, [path, toy_data_bin, "--out-json", tmp_path / "e.json"], only_line=True)
    assert line == f"error: checkpoint {path} is not a regular file"


def test_a_stored_replace_unk_file_is_never_opened(real, tmp_path):
    """--replace-unk PATH (an alignment dictionary) is the decoder's choice: a path stored in the
    checkpoint (a pipe here, which would block) is dropped on loading, in both layouts."""
    pipe = tmp_path / "align-pipe"
    os.mkfifo(pipe)
    good = torch.load(real, weights_only=True)
    good["cfg"]["generation"]["replace_unk"] = str(pipe)
    args = args_layout(good)
    args["args"].replace_unk = str(pipe)
    for name, state in (("cfg", good), ("args", args)):
        torch.save(state, tmp_path / f"{name}.pt")
        loaded = checkpoints.load_checkpoint_to_cpu(str(tmp_path / f"{name}.pt"))
        stored = loaded["cfg"]["generation"]["replace_unk"] if name == "cfg" else loaded["args"].replace_unk
        assert stored is None


def test_a_model_archive_is_unpacked_safely_and_kept(real, toy_data_bin, tmp_path):
    """fairseq's from_pretrained extracts an archive unfiltered and deletes it; the plugin's guard
    refuses a member escaping the temp dir, and leaves the user's archive in place."""
    import tarfile

    from residual_fairseq.models.resi_dual import ResiDualModel

    def archive(name, escaping):
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as bundle:
            bundle.add(real, arcname="model/model.pt")
            for dictionary in Path(toy_data_bin).glob("dict.*.txt"):
                bundle.add(dictionary, arcname=f"model/{dictionary.name}")
            if escaping:
                info = tarfile.TarInfo(f"model/../../../../../../..{tmp_path}/escaped.txt")
                info.size = 3
                bundle.addfile(info, io.BytesIO(b"bad"))
        return path, path.read_bytes()

    hostile, hostile_bytes = archive("hostile.tar.gz", escaping=True)
    with pytest.raises(UserError, match="holds an unsafe member, refused"):
        ResiDualModel.from_pretrained(str(hostile), checkpoint_file="model.pt")
    assert not (tmp_path / "escaped.txt").exists() and hostile.read_bytes() == hostile_bytes
    good, good_bytes = archive("good.tar.gz", escaping=False)
    pair = next(Path(toy_data_bin).glob("train.*-*.*.idx")).name.split(".")[1]  # (the archive has no splits)
    source_lang, target_lang = pair.split("-")
    hub = ResiDualModel.from_pretrained(str(good), checkpoint_file="model.pt", source_lang=source_lang,
                                        target_lang=target_lang)
    assert hub.models and good.read_bytes() == good_bytes


@pytest.mark.parametrize("layout", ["cfg", "args"])
@pytest.mark.parametrize("option, value, expected", [
    ("dropout", "abc", "not a number"), ("encoder_layers", 2.5, "not an integer"),
    ("share_all_embeddings", "yes", "not True or False"), ("encoder_layers", True, "not an integer"),
    ("lr", ["abc"], "not a list of numbers"), ("activation_fn", 7, "not a string"),
])
def test_a_config_value_of_another_type_than_fairseqs_is_refused_naming_it(layout, option, value, expected, real,
                                                                          tmp_path):
    good = torch.load(real, weights_only=True)
    where = "args" if layout == "args" else "cfg.model"
    torch.save(with_model_options(good if layout == "cfg" else args_layout(good), **{option: value}),
               tmp_path / "typed.pt")
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(f"stores {where}.{option} = {value!r}, {expected}")):
        checkpoints.read_checkpoint(tmp_path / "typed.pt")
    # What fairseq's own checkpoints hold passes: an int for a float, "True" for a bool (older fairseq).
    fine = with_model_options(good, dropout=0, share_all_embeddings="True", lr=[1])
    fine["cfg"]["task"]["max_source_positions"] = 64
    torch.save(fine if layout == "cfg" else args_layout(fine), tmp_path / "fine.pt")
    checkpoints.read_checkpoint(tmp_path / "fine.pt")


def test_the_checks_never_hold_the_whole_file_in_memory(real, tmp_path):
    """The zip's directory, the records' headers and the pickle are read, not the weights:
    Python holds far less than the file while checking and loading a 32 MB checkpoint (the
    whole-file read held twice its size)."""
    import tracemalloc

    state = torch.load(real, weights_only=True)
    state["model"]["encoder.extra"] = torch.randn(8 * 2 ** 20)
    torch.save(state, tmp_path / "big.pt")
    tracemalloc.start()
    try:
        checkpoints.load_checkpoint_to_cpu(str(tmp_path / "big.pt"))
        checkpoints.read_checkpoint(tmp_path / "big.pt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (tmp_path / "big.pt").stat().st_size / 8, peak


def test_what_was_checked_is_what_is_loaded_even_if_the_file_changes(real, tmp_path, monkeypatch):
    """The file is opened once and read in parts: a pickle rewritten in place between the
    check and the load is not what torch unpickles (it gets the bytes that were checked)."""
    from residual_fairseq.checkpoints import read as read_module

    stored = torch.load(real, weights_only=True)
    checked, swapped = tmp_path / "checked.pt", tmp_path / "swapped.pt"
    torch.save(with_model_options(stored, dropout=0.125), checked)
    torch.save(with_model_options(stored, dropout=0.25), swapped)  # the same length: one float differs
    assert checked.stat().st_size == swapped.stat().st_size
    real_load = torch.load

    def load_after_a_swap(handle, *args, **kwargs):
        with open(checked, "r+b") as rewrite:  # the same inode, rewritten in place
            rewrite.write(swapped.read_bytes())
        return real_load(handle, *args, **kwargs)

    monkeypatch.setattr(read_module.torch, "load", load_after_a_swap)
    state = checkpoints.read_checkpoint(checked)
    assert checked.read_bytes() == swapped.read_bytes()
    assert state["cfg"]["model"].dropout == 0.125


def test_a_model_scripts_after_a_checkpoint_was_checked():
    """The size check builds the config's model on the meta device with fairseq's sinusoidal
    table short-circuited; a wrapper left on SinusoidalPositionalEmbedding afterwards made every
    later torch.jit.script of a model with sinusoidal positions fail ("Can't redefine method")."""
    from fairseq import models
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
    from residual_fairseq.variants import build_model, toy_dictionary

    table = SinusoidalPositionalEmbedding.__dict__["get_embedding"]
    vocabulary = toy_dictionary()
    args = argparse.Namespace(arch="transformer", task="translation", criterion="cross_entropy",
                              max_source_positions=64, max_target_positions=64, encoder_embed_dim=16,
                              decoder_embed_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
                              encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    ARCH_CONFIG_REGISTRY["transformer"](args)
    model = models.build_model(argparse.Namespace(**vars(args)),
                               argparse.Namespace(source_dictionary=vocabulary, target_dictionary=vocabulary))
    checkpoints.check_config_fits_weights({"args": args, "model": model.state_dict()}, "transformer")
    assert SinusoidalPositionalEmbedding.__dict__["get_embedding"] is table  # put back
    scripted = torch.jit.script(build_model("resi_dual", encoder_layers=1, decoder_layers=1, encoder_embed_dim=16,
                                            decoder_embed_dim=16, encoder_ffn_embed_dim=32,
                                            decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                                            decoder_attention_heads=2).eval())
    assert scripted is not None
