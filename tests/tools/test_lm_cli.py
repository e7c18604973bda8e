"""ResiDual language models through fairseq's real CLIs and the project's tools.

One toy corpus (runs of consecutive words, so the next word is learnable) is prepared
with ``residual-fairseq-prepare --dataset custom-lm`` and a tiny ``resi_dual_lm`` is
trained once by ``fairseq-train``; the tests score it with ``fairseq-eval-lm``, sample
from it (Python API and ``fairseq-interactive``), reload it, and train the shipped
sample-lm config with ``fairseq-hydra-train``.
"""
import json
import random
import re
import sys

import pytest
import torch

from helpers import CLI_ENV, USER_DIR, fairseq_cli, run, user_error
from residual_fairseq import configs
from residual_fairseq.models.lm import ResiDualLanguageModel

WORDS = [f"w{i}" for i in range(24)]
LM_TRAIN_ARGS = [
    "--task", "language_modeling", "--arch", "resi_dual_lm_gpt2_tiny", "--decoder-layers", "2",
    "--decoder-attention-heads", "2", "--dual-scale-decoder", "0.25", "--share-decoder-input-output-embed",
    "--tokens-per-sample", "32", "--sample-break-mode", "none", "--dropout", "0.0", "--attention-dropout", "0.0",
    "--optimizer", "adam", "--lr", "5e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
    "--max-tokens", "512", "--num-workers", "0", "--cpu", "--seed", "1",
    "--no-progress-bar", "--log-format", "simple", "--log-interval", "10",
]


def toy_lines(n, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        start = rng.randrange(len(WORDS))
        lines.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(rng.randint(4, 10))))
    return lines


@pytest.fixture(scope="module")
def toy_lm(tmp_path_factory):
    """(prepared dir, save dir, training log) of a tiny resi_dual_lm trained by fairseq-train."""
    from residual_fairseq.data.cli import main as prepare_main

    root = tmp_path_factory.mktemp("toy_lm")
    for split, n in (("train", 800), ("valid", 40), ("test", 40)):
        (root / f"{split}.txt").write_text("\n".join(toy_lines(n, seed=len(split))) + "\n")
    prepared = root / "prepared"
    prepare_main(["--dataset", "custom-lm", "--train", str(root / "train.txt"), "--valid", str(root / "valid.txt"),
                  "--test", str(root / "test.txt"), "--subword", "none", "--out", str(prepared), "--quiet"])
    save_dir = root / "ckpt"
    proc = run([fairseq_cli("fairseq-train"), prepared / "bin", "--user-dir", USER_DIR, *LM_TRAIN_ARGS,
                "--max-update", "150", "--save-dir", save_dir, "--no-epoch-checkpoints"])
    return prepared, save_dir, proc.stdout + proc.stderr


def test_cli_options_reach_the_model(toy_lm):
    _, save_dir, log = toy_lm
    assert re.search(r"ResiDualLanguageModel\(.*?dual_scale=0\.25\b", log, re.S), log[-2000:]
    from fairseq import checkpoint_utils

    [model], _ = checkpoint_utils.load_model_ensemble([str(save_dir / "checkpoint_last.pt")])
    assert isinstance(model, ResiDualLanguageModel)
    assert model.decoder.cfg.dual_scale_decoder == 0.25 and len(model.decoder.layers) == 2


def test_fairseq_eval_lm_scores_the_trained_model(toy_lm, capsys):
    """residual-fairseq-evaluate runs the real fairseq-eval-lm (with a context window)."""
    from residual_fairseq.evaluate import main as evaluate_main

    prepared, save_dir, _ = toy_lm
    evaluate_main([str(save_dir / "checkpoint_last.pt"), str(prepared / "bin"), "--tokens-per-sample", "32",
                   "--context-window", "16", "--out-json", str(save_dir / "ppl.json")])
    out = capsys.readouterr().out
    assert "fairseq-eval-lm" in out and "--context-window 16" in out
    import json

    result = json.loads((save_dir / "ppl.json").read_text())
    # 26 word types: a model that learned "next word = successor" is far below uniform.
    assert 1.0 < result["perplexity"] < 6.0, result
    assert result["tokens"] == sum(len(line.split()) + 1 for line in (prepared / "test.txt").read_text().splitlines())


def test_sampling_and_beam_search_from_python(toy_lm):
    from residual_fairseq import load_language_model

    prepared, save_dir, _ = toy_lm
    lm = load_language_model(save_dir / "checkpoint_last.pt", data=prepared / "bin")
    assert isinstance(lm.hub.models[0], ResiDualLanguageModel)
    beam = lm.sample("w3 w4 w5", beam=4, max_len_b=4)
    assert beam == lm.sample("w3 w4 w5", beam=4, max_len_b=4)
    assert beam.startswith("w3 w4 w5 w6"), beam  # the learned successor
    torch.manual_seed(0)
    sampled = lm.sample(["w10 w11", "w20"], sampling=True, sampling_topk=5, temperature=0.8, max_len_b=5)
    assert len(sampled) == 2 and sampled[0].startswith("w10 w11") and sampled[1].startswith("w20")
    assert lm.perplexity("w1 w2 w3 w4 w5 w6") < lm.perplexity("w6 w1 w5 w2 w4 w3")


def test_sampling_never_returns_a_cut_prompt_and_empty_text_has_no_perplexity(toy_lm):
    """max_len_b counts the prompt (fairseq's limit on prompt + continuation): one that leaves
    no room would return the prompt cut short, and the mean score of no tokens is nan."""
    from residual_fairseq import load_language_model
    from residual_fairseq.errors import UserError

    prepared, save_dir, _ = toy_lm
    lm = load_language_model(save_dir / "checkpoint_last.pt", data=prepared / "bin")
    assert lm.prompt_tokens("w3 w4 w5") == 3
    assert lm.sample("w3 w4 w5", max_len_b=4).split()[:3] == ["w3", "w4", "w5"]  # room for one token
    for max_len_b in (3, 2):
        with pytest.raises(UserError, match=f"max_len_b={max_len_b} counts the prompt's tokens too.*'w3 w4 w5' "
                                            f"is 3 tokens.*give max_len_b above 3"):
            lm.sample(["w1", "w3 w4 w5"], beam=2, max_len_b=max_len_b)
    with pytest.raises(UserError, match="the model's 32 positions leave no room"):
        lm.sample(" ".join(WORDS + WORDS[:7]), max_len_b=100)
    for text in ("", "   "):
        with pytest.raises(UserError, match="has no tokens to score"):
            lm.perplexity(text)


def test_python_api_loads_once_and_talks_only_when_asked(toy_lm, tmp_path):
    """In a plain Python session: a file name with ':' is one file (fairseq's from_pretrained
    would split it into an ensemble), and loading and sampling print nothing on stderr
    (no fairseq INFO lines, no torch pin_memory warning)."""
    import shutil

    prepared, save_dir, _ = toy_lm
    checkpoint = tmp_path / "run:1.pt"
    shutil.copy(save_dir / "checkpoint_last.pt", checkpoint)
    script = ("from residual_fairseq import load_language_model\n"
              f"lm = load_language_model({str(checkpoint)!r}, data={str(prepared / 'bin')!r})\n"
              "print(lm.sample('w3 w4 w5', beam=2, max_len_b=5))\n"
              "print(round(lm.perplexity('w1 w2 w3'), 3))\n")
    proc = run([sys.executable, "-c", script], env=CLI_ENV)
    assert proc.stdout.startswith("w3 w4 w5 w"), proc.stdout  # the prompt and a continuation
    assert proc.stderr == "", proc.stderr[-2000:]


def test_fairseq_interactive_generates(toy_lm):
    prepared, save_dir, _ = toy_lm
    proc = subprocess_run_with_input(
        [fairseq_cli("fairseq-interactive"), prepared / "bin", "--task", "language_modeling", "--user-dir", USER_DIR,
         "--path", save_dir / "checkpoint_last.pt", "--beam", "2", "--max-len-b", "6", "--cpu"],
        "w7 w8 w9\n")
    hypotheses = [line for line in proc.stdout.splitlines() if line.startswith("H-0")]
    assert hypotheses and "w7 w8 w9 w10" in hypotheses[0], proc.stdout[-2000:]


def subprocess_run_with_input(cmd, text):
    import subprocess

    proc = subprocess.run([str(c) for c in cmd], input=text, env=CLI_ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_reloaded_checkpoint_decodes_identically(toy_lm, tmp_path):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.hub_utils import GeneratorHubInterface
    from fairseq.trainer import Trainer
    from residual_fairseq.language_models import load_language_model

    prepared, _, _ = toy_lm
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(prepared / "bin"), "--user-dir", USER_DIR, *LM_TRAIN_ARGS, "--dual-scale-decoder", "0.5",
        "--dropout", "0.1", "--save-dir", str(tmp_path)])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=512, seed=1).next_epoch_itr(shuffle=True)
    for _, sample in zip(range(20), batches):
        trainer.train_step([sample])
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(tmp_path / "checkpoint_last.pt"), {})
    model = trainer.model
    model.eval()
    in_memory = GeneratorHubInterface(cfg, task, [model])
    reloaded = load_language_model(tmp_path / "checkpoint_last.pt", data=prepared / "bin").hub
    expected, actual = model.state_dict(), reloaded.models[0].state_dict()
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    assert reloaded.models[0].decoder.cfg.dual_scale_decoder == 0.5
    prompts = ["w1 w2", "w9 w10 w11", "w23"]
    for prompt in prompts:
        want = in_memory.generate([in_memory.encode(prompt)], beam=3, max_len_b=5)[0]
        got = reloaded.generate([reloaded.encode(prompt)], beam=3, max_len_b=5)[0]
        for w, g in zip(want, got):
            assert torch.equal(w["tokens"], g["tokens"])
            torch.testing.assert_close(w["score"], g["score"])


def test_shipped_sample_lm_config_trains_with_fairseq_hydra_train(toy_lm, tmp_path):
    """The committed resi_dual-6l file, shrunk by overrides: hydra keeps the plugin field."""
    prepared, _, _ = toy_lm
    save_dir = tmp_path / "hydra_run"
    proc = run([
        fairseq_cli("fairseq-hydra-train"), "--config-dir", configs.dataset_dir("sample-lm"),
        "--config-name", "resi_dual-6l", f"task.data={prepared / 'bin'}", f"common.user_dir={USER_DIR}",
        f"checkpoint.save_dir={save_dir}", "common.cpu=true", "model.decoder_layers=2",
        "model.dual_scale_decoder=0.125", "optimization.max_update=2", "common.log_format=simple",
        "task.tokens_per_sample=32",
    ], env=CLI_ENV)
    output = proc.stdout + proc.stderr
    assert "ResiDualLanguageModel(" in output and "dual_scale=0.125" in output
    from fairseq import checkpoint_utils

    [model], _ = checkpoint_utils.load_model_ensemble([str(save_dir / "checkpoint_last.pt")])
    assert isinstance(model, ResiDualLanguageModel) and len(model.decoder.layers) == 2
    assert model.decoder.cfg.dual_scale_decoder == 0.125 and model.decoder.embed_dim == 64


@pytest.mark.parametrize("dataset", [name for name, spec in configs.DATASETS.items()
                                     if spec.task == "language_modeling"])
def test_lm_configs_differ_only_in_residual_scheme(dataset):
    spec = configs.DATASETS[dataset]
    for layers in spec.depths:
        rendered = {variant: configs.load(dataset, variant, layers) for variant in configs.LM_VARIANTS}
        assert rendered["post_ln"]["model"]["_name"] == rendered["pre_ln"]["model"]["_name"] == "transformer_lm"
        assert rendered["resi_dual"]["model"]["_name"] == "resi_dual_lm"
        for variant in ("pre_ln", "resi_dual"):
            differing = {(group, key) for group in rendered["post_ln"]
                         for key in set(rendered["post_ln"][group]) | set(rendered[variant][group])
                         if rendered["post_ln"][group].get(key) != rendered[variant][group].get(key)}
            assert differing <= {("model", "_name"), ("model", "decoder_normalize_before"),
                                 ("model", "dual_scale_decoder")}, differing
        model = rendered["resi_dual"]["model"]
        assert model["decoder_input_dim"] == model["decoder_output_dim"] == model["decoder_embed_dim"]


def test_analysis_measures_language_models(toy_lm):
    """residual-fairseq-analyze's API on LM data: one stack (the decoder), d measured for ResiDual."""
    from residual_fairseq.analysis import data, models, probe, training
    from residual_fairseq.fairseq_data import load_task

    prepared, _, _ = toy_lm
    task = load_task(prepared / "bin", tokens_per_sample=32)
    batches = data.measurement_batches(task, "valid", max_tokens=256, num_batches=1)
    criterion = training.build_label_smoothed_criterion(task, 0.0)
    for variant in ("post_ln", "pre_ln", "resi_dual"):
        model = models.fresh_model(variant, task, decoder_layers=3, embed_dim=16, ffn_dim=32, heads=2)
        result = probe.measure(model, criterion, batches)
        assert list(result.stacks) == ["decoder"]
        assert result.loss_other_source is None   # a language model has no source
        stack = result.stacks["decoder"]
        assert len(stack.param_grad_norm) == 3 and all(g > 0 for g in stack.param_grad_norm)
        assert (stack.dual_norm is not None) == (variant == "resi_dual")


def test_benchmark_builds_and_generates_language_models(toy_lm):
    """The speed benchmark's LM path: same sizes for the three variants, generation of fixed length."""
    from residual_fairseq.benchmark import data, speed, training

    prepared, _, _ = toy_lm
    task = data.load_task(prepared / "bin")
    test = data.first_sentences(data.draw_batches(task, "test", None, max_sentences=2, shuffle=False), 2)
    sizes, lengths = {}, set()
    for variant in ("post_ln", "pre_ln", "resi_dual"):
        model = training.build_variant(task, variant, "gpt2_tiny", encoder_layers=2, decoder_layers=2).eval()
        sizes[variant] = sum(p.numel() for p in model.parameters())
        generator, prompts = speed._language_model_generation(task, model, test[:1], beam=2)
        with torch.inference_mode():
            hypotheses = task.inference_step(generator, [model], prompts[0])
        steps = test[0]["net_input"]["src_tokens"].size(1) // 2
        lengths.update(len(h[0]["tokens"]) for h in hypotheses)
    # Every hypothesis of every variant: the same number of steps, at least min_len, then </s>.
    assert len(lengths) == 1 and lengths.pop() > steps
    assert sizes["resi_dual"] == sizes["pre_ln"] == sizes["post_ln"] + 2 * 64  # gpt2_tiny width 64


def test_tools_offer_language_models_their_three_variants(toy_lm, tmp_path, capsys):
    """The deep-Transformer baselines are translation models: by default the tools run the
    three LM variants on LM data, and asking for another is one line, not a crash."""
    from residual_fairseq import reproduce, train
    from residual_fairseq.analysis.cli import main as analyze_main
    from residual_fairseq.benchmark import parse_variants
    from residual_fairseq.errors import UserError

    prepared, _, _ = toy_lm
    data = {"sample-lm": prepared / "bin"}
    assert [run.variant for run in reproduce.matrix(data, tmp_path / "out", layers=[2])] == list(configs.LM_VARIANTS)
    with pytest.raises(UserError, match="sample-lm is a language modeling dataset: its variants are "
                                        "post_ln, pre_ln, resi_dual, not b2t"):
        reproduce.matrix(data, tmp_path / "out", variants=["b2t"], layers=[2])
    assert parse_variants(None, language_model=True) == list(configs.LM_VARIANTS)
    with pytest.raises(UserError, match="choose from language models: post_ln, pre_ln, resi_dual"):
        parse_variants("pre_ln,deepnet", language_model=True)
    with pytest.raises(UserError, match="has no -s/-t language pair"):
        train.plan(train.TrainRequest("sample-lm", "resi_dual", 2, prepared / "bin", tmp_path / "ckpt",
                                      source_lang="en"))
    assert train.plan(train.TrainRequest("sample-lm", "resi_dual", 2, prepared / "bin",
                                         tmp_path / "ckpt")).settings["model"]["_name"] == "resi_dual_lm"

    with pytest.raises(SystemExit) as exit_info:
        analyze_main([str(prepared / "bin"), "--out", str(tmp_path / "analysis"), "--variants", "admin",
                      "--layers", "2", "--embed-dim", "16", "--batches", "1", "--max-tokens", "256"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: --variants admin: language models come as post_ln, pre_ln, resi_dual"


def test_reproduce_trains_and_scores_a_language_model_end_to_end(toy_lm, tmp_path):
    """The drivers on LM data: residual-fairseq-reproduce trains through residual-fairseq-train,
    scores with fairseq-eval-lm and tabulates perplexity; run.json records the real depth."""
    prepared, _, _ = toy_lm
    out = tmp_path / "reproduce"
    proc = run([sys.executable, "-m", "residual_fairseq.reproduce", "--dataset", "sample-lm", "--data",
                prepared / "bin", "--variants", "resi_dual", "--layers", "2", "--out", out, "--threads", "1", "--",
                "--max-update", "30", "--max-tokens", "512",
                # the toy valid split is 3 blocks: fairseq's batching would drop them as one partial batch of 8
                "--required-batch-size-multiple", "1"], env=CLI_ENV)
    save_dir = out / "runs" / "sample-lm" / "resi_dual-2l" / "seed1"
    record = json.loads((save_dir / "run.json").read_text())
    assert record["name"] == "resi_dual-2l" and record["model"]["arch"] == "resi_dual_lm"
    assert record["model"]["decoder_layers"] == 2
    result = json.loads((save_dir / "result.json").read_text())
    assert result["tokens"] > 0 and result["perplexity"] > 1 and "fairseq-eval-lm" in result["command"]
    table = (out / "results-lm.md").read_text()
    # an own corpus (prepare --dataset custom-lm, in prepared/) trained with the sample-lm config: both named
    assert f"| prepared (config sample-lm) | resi_dual | 2 | 1 | {result['perplexity']:.2f} |" in table, table
    assert "note: 1 CPU thread" in proc.stdout


@pytest.mark.slow
def test_reproduce_extend_trains_a_budget_ended_run_on_from_its_last_checkpoint(toy_lm, tmp_path):
    """A run ended by --max-update 20, rerun with --extend and --max-update 40: it resumes at update 20
    (not from scratch), trains to 40 and is scored again; the first score is kept in before-extend/."""
    prepared, _, _ = toy_lm
    out = tmp_path / "reproduce"
    command = [sys.executable, "-m", "residual_fairseq.reproduce", "--dataset", "sample-lm", "--data", prepared / "bin",
               "--variants", "resi_dual", "--layers", "1", "--out", out, "--threads", "1"]
    flags = ["--max-tokens", "512", "--required-batch-size-multiple", "1"]
    run(command + ["--", "--max-update", "20", *flags], env=CLI_ENV)
    save_dir = out / "runs" / "sample-lm" / "resi_dual-1l" / "seed1"
    first = json.loads((save_dir / "result.json").read_text())
    [record] = json.loads((out / "runs.json").read_text())
    assert record["ended_by"] == "budget"
    refused = run(command + ["--", "--max-update", "40", *flags], env=CLI_ENV, check=False)
    assert refused.returncode == 2 and "add --extend" in refused.stderr

    proc = run(command + ["--extend", "--", "--max-update", "40", *flags], env=CLI_ENV)
    aside = save_dir / "before-extend" / f"epoch{record['epochs']}"
    assert json.loads((aside / "result.json").read_text()) == first
    assert "resuming from" in proc.stdout and "20 updates" in proc.stdout, proc.stdout[-3000:]
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 40
    second = json.loads((save_dir / "result.json").read_text())
    assert second["perplexity"] != first["perplexity"]
    assert json.loads((save_dir / "run.json").read_text())["extra_args"] == ["--max-update", "40", *flags]
    [extended] = json.loads((out / "runs.json").read_text())
    assert extended["epochs"] > record["epochs"] and extended["ended_by"] == "budget"


def test_loading_a_non_language_model_is_one_clear_error(toy_lm, tmp_path):
    from residual_fairseq import load_language_model
    from residual_fairseq.errors import UserError

    prepared, save_dir, _ = toy_lm
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    state["cfg"]["task"]["_name"] = "translation"
    torch.save(state, tmp_path / "translation.pt")
    with pytest.raises(UserError, match="is a translation checkpoint, not a language model"):
        load_language_model(tmp_path / "translation.pt", data=prepared / "bin")


def test_evaluating_a_non_language_model_is_refused_before_fairseq_runs(toy_lm, tmp_path, capsys):
    """fairseq-eval-lm would load a translation model and crash after seconds with an
    AttributeError: the stored task is checked first, nothing is run or written."""
    from residual_fairseq.errors import UserError
    from residual_fairseq.language_models import evaluate_lm

    prepared, save_dir, _ = toy_lm
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    state["cfg"]["task"]["_name"] = "translation"
    torch.save(state, tmp_path / "translation.pt")
    capsys.readouterr()
    with pytest.raises(UserError, match="translation.pt is a translation checkpoint, not a language model"):
        evaluate_lm(tmp_path / "translation.pt", prepared / "bin", tokens_per_sample=32, context_window=16,
                    out_json=tmp_path / "ppl.json")
    assert "fairseq-eval-lm" not in capsys.readouterr().out and not (tmp_path / "ppl.json").exists()
    # From Python too, out_json may not be the checkpoint (nor a data file) it evaluates.
    model = tmp_path / "model.pt"
    model.write_bytes((save_dir / "checkpoint_last.pt").read_bytes())
    for out_json, role in ((model, "the checkpoint"), (prepared / "bin" / "dict.txt", "the data file")):
        with pytest.raises(UserError, match=f"out_json {out_json} would overwrite {role}"):
            evaluate_lm(model, prepared / "bin", tokens_per_sample=32, context_window=16, out_json=out_json)
    assert model.read_bytes() == (save_dir / "checkpoint_last.pt").read_bytes()
    assert "fairseq-eval-lm" not in capsys.readouterr().out


def test_evaluating_a_language_model_on_translation_data_is_one_line(toy_lm, toy_data_bin, tmp_path, capsys):
    """Issue 38: a language model given translation data failed inside fairseq-generate with a dump
    of size mismatches; it is one line saying what it is and what to give instead, nothing run."""
    from helpers import user_error
    from residual_fairseq.evaluate import main as evaluate_main

    _, save_dir, _ = toy_lm
    checkpoint = save_dir / "checkpoint_last.pt"
    line = user_error(capsys, evaluate_main, [checkpoint, toy_data_bin, "--subword", "none",
                                              "--out-json", tmp_path / "r.json"])
    assert line == (f"error: checkpoint {checkpoint} is a language model (task language_modeling), not a "
                    "translation model: evaluate it on its language-model data (a directory with one dict.txt) "
                    "for its perplexity"), line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("extra", [["--gen-subset", "valid"], ["--context-window", "0"], ["--tokens-per-sample=8"],
                                   ["--output-word-probs", "--path", "other.pt"], ["--cpu"], ["--task=translation"]])
def test_extra_eval_lm_flags_may_not_override_the_evaluations_own(tmp_path, capsys, extra):
    """fairseq lets a later flag win: an extra --gen-subset/--context-window... would score another
    split or window than the printed line and the JSON say. Refused before anything is read."""
    from residual_fairseq.errors import UserError
    from residual_fairseq.evaluate import main as evaluate_main
    from residual_fairseq.language_models import eval_lm_command, evaluate_lm

    flag = next(word for word in extra if word != "--output-word-probs").partition("=")[0]
    message = f"{flag} in the extra fairseq-eval-lm arguments: the evaluation sets it itself"
    with pytest.raises(UserError, match=message):
        evaluate_lm(tmp_path / "nothing.pt", tmp_path, extra_args=extra)
    with pytest.raises(UserError, match=message):
        eval_lm_command("c.pt", tmp_path, extra_args=extra)
    assert eval_lm_command("c.pt", tmp_path, extra_args=["--output-word-probs"])[-1] == "--output-word-probs"
    (tmp_path / "dict.txt").write_text("w1 1\n")  # language-model data: residual-fairseq-evaluate scores perplexity
    line = user_error(capsys, evaluate_main, [tmp_path / "nothing.pt", tmp_path, "--generate-args=" + " ".join(extra)])
    assert line.startswith(f"error: {message}"), line


@pytest.mark.parametrize("dataset", [name for name, spec in configs.DATASETS.items()
                                     if spec.task == "language_modeling"])
def test_lm_configs_build_their_models(dataset):
    """Each shipped LM config builds (shapes only) through fairseq's hydra-path builder;
    ResiDual's LN(d_N) is the only difference in size from Pre-LN's final norm."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from fairseq import models
    from residual_fairseq.variants import toy_dictionary

    dictionary = toy_dictionary(70000)  # above the wiki103 recipe's adaptive cutoffs
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    for layers in configs.DATASETS[dataset].depths:
        counts = {}
        for variant in configs.LM_VARIANTS:
            settings = configs.load(dataset, variant, layers)
            model_cfg = {**settings["model"], "tokens_per_sample": settings["task"]["tokens_per_sample"],
                         "max_target_positions": None, "add_bos_token": False, "tpu": False}
            with torch.device("meta"):
                model = models.build_model(OmegaConf.create(model_cfg), task)
            assert len(model.decoder.layers) == layers
            assert model.decoder.embed_dim == settings["model"]["decoder_embed_dim"]
            assert model.decoder.project_in_dim is None and model.decoder.project_out_dim is None
            counts[variant] = sum(p.numel() for p in model.parameters())
        assert counts["resi_dual"] == counts["pre_ln"] == counts["post_ln"] + 2 * model.decoder.embed_dim


def test_an_evaluation_of_no_tokens_is_an_error_not_perplexity_one():
    """fairseq-eval-lm reports 'Loss 0, Perplexity 1.00' when it skipped every block
    (e.g. blocks longer than the model's positions): that must not become a result."""
    from residual_fairseq.errors import UserError
    from residual_fairseq.language_models import parse_eval_lm_output

    scored = ("fairseq_cli.eval_lm | Evaluated 309 tokens in 0.1s (3090.00 tokens/s)\n"
              "fairseq_cli.eval_lm | Loss (base 2): 4.2500, Perplexity: 19.03\n")
    assert parse_eval_lm_output(scored)["tokens"] == 309
    with pytest.raises(UserError, match="scored no tokens"):
        parse_eval_lm_output(scored.replace("309", "0"))


def test_language_models_use_the_subword_model_beside_their_data(tmp_path):
    """prepare writes spm.model (sentencepiece) or bpe.codes (--subword bpe) beside bin/:
    either one is applied to the text, as for translation; none means text is used as is."""
    from residual_fairseq.errors import UserError
    from residual_fairseq.language_models import _subword_of

    (tmp_path / "bin").mkdir()
    assert _subword_of(tmp_path / "bin") == {}
    (tmp_path / "bpe.codes").write_text("#version: 0.2\nt h\nth e</w>\n")
    assert _subword_of(tmp_path / "bin") == {"bpe": "subword_nmt", "bpe_codes": str(tmp_path / "bpe.codes")}
    (tmp_path / "bpe.codes").write_text("not a codes file at all\n")
    with pytest.raises(UserError, match="is not a subword-nmt codes file"):
        _subword_of(tmp_path / "bin")

