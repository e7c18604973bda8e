"""residual-fairseq-train: command rendering, CPU adaptation, dry run, real run and resume."""
import json
import shlex

import pytest

from helpers import CLI_ENV, REPO, run, user_error
from residual_fairseq import early_stopping, train, training_log
from residual_fairseq.errors import UserError
from residual_fairseq.training_log import validation_curve

# Small enough for seconds of CPU training on the toy corpus.
TINY = ["--max-update", "4", "--max-tokens", "1200", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--no-epoch-checkpoints",
        "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 5}', "--log-interval", "1"]


def request(data, save_dir, **kwargs):
    return train.TrainRequest("sample-es-en", "resi_dual", 3, data, save_dir, **kwargs)


def test_plan_renders_the_config_and_passes_extra_flags(toy_data_bin, tmp_path):
    plan = train.plan(request(toy_data_bin, tmp_path / "ck", seed=7, cpu=True, extra_args=["--max-epoch", "1"]))
    (command,) = plan.commands
    assert command[0].endswith("fairseq-train") and command[1] == str(toy_data_bin)
    text = shlex.join(command)
    assert "--arch resi_dual" in text and "--encoder-layers 3" in text and "--dual-scale-encoder 1.0" in text
    assert "--seed 7" in text and "--cpu" in command and command[-2:] == ["--max-epoch", "1"]
    assert f"--save-dir {tmp_path / 'ck'}" in text and "--user-dir" in text


def test_cpu_drops_fp16_and_says_so(toy_data_bin, tmp_path):
    opus = train.TrainRequest("opus100", "resi_dual", 18, toy_data_bin, tmp_path, cpu=True)
    plan = train.plan(opus)
    assert not {"--fp16", "--memory-efficient-fp16", "--amp"} & set(plan.commands[0])
    assert "--cpu" in plan.commands[0] and "--dual-scale-decoder" in plan.commands[0]
    assert any("common.fp16" in note and "common.memory_efficient_fp16" in note for note in plan.notes)
    gpu = train.plan(train.TrainRequest("opus100", "resi_dual", 18, toy_data_bin, tmp_path, cpu=False))
    assert "--fp16" in gpu.commands[0] and "--cpu" not in gpu.commands[0]


def test_cpu_multi_process_uses_gloo_ranks(toy_data_bin, tmp_path):
    plan = train.plan(request(toy_data_bin, tmp_path, nprocs=2, cpu=True))
    assert len(plan.commands) == 2
    for rank, command in enumerate(plan.commands):
        text = shlex.join(command)
        assert "--distributed-backend gloo --ddp-backend legacy_ddp" in text
        assert "--distributed-world-size 2" in text and "--distributed-no-spawn" in text
        assert "--load-checkpoint-on-all-dp-ranks" in text  # resume without a weights-only broadcast
        assert command[-2:] == ["--distributed-rank", str(rank)]
    gpu = train.plan(request(toy_data_bin, tmp_path, nprocs=4, cpu=False))
    assert len(gpu.commands) == 1 and gpu.commands[0][-2:] == ["--distributed-world-size", "4"]


@pytest.mark.slow
def test_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="data directory not found"):
        train.plan(request(tmp_path / "nowhere", tmp_path))
    proc = run(["python3", REPO / "scripts" / "train.py", "--dataset", "wmt14-en-de", "--variant", "pre_ln",
                "--layers", "24", "--data", tmp_path, "--save-dir", tmp_path / "x"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_dry_run_prints_and_runs_nothing(toy_data_bin, tmp_path, capsys):
    train.main(["--dataset", "iwslt14-de-en", "--variant", "pre_ln", "--layers", "12", "--data", str(toy_data_bin),
                "--save-dir", str(tmp_path / "ck"), "--dry-run", "--", "--max-epoch", "3"])
    out = capsys.readouterr().out
    assert "would run:" in out and "--encoder-normalize-before" in out and out.rstrip().endswith("--max-epoch 3")
    assert not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_train_then_resume(toy_data_bin, tmp_path):
    save_dir = tmp_path / "ck"
    base = ["python3", REPO / "scripts" / "train.py", "--dataset", "sample-es-en", "--variant", "resi_dual",
            "--layers", "3", "--data", toy_data_bin, "--save-dir", save_dir, "--", *TINY]
    # with Python's default warnings (CLI_ENV hides them), to see which reach the console
    first = run(base, env={key: value for key, value in CLI_ENV.items() if key != "PYTHONWARNINGS"})
    assert "running:" in first.stdout and "no CUDA on this machine" in first.stdout
    assert (save_dir / "checkpoint_last.pt").is_file()
    record = json.loads((save_dir / "run.json").read_text())
    assert (record["dataset"], record["variant"], record["layers"]) == ("sample-es-en", "resi_dual", 3)
    log = (save_dir / "train.log").read_text()
    assert '"valid_loss"' in log and '"num_updates": "4"' in log
    # torch's deprecation warnings from inside fairseq: kept in train.log, off the console
    for message in ("`torch.cuda.amp.autocast(args...)` is deprecated", "Support for mismatched key_padding_mask"):
        assert message in log and message not in first.stdout + first.stderr

    # A kill while fairseq copies checkpoint_last.pt leaves it truncated: the driver repairs it.
    last = save_dir / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:4096])
    second = run(base + ["--max-update", "6"], env=CLI_ENV)
    assert "resuming from" in second.stdout
    assert f"{last} was truncated" in second.stdout and "checkpoint_best.pt" in second.stdout
    log = (save_dir / "train.log").read_text()
    assert "Loaded checkpoint" in log and '"num_updates": "6"' in log


@pytest.mark.slow
def test_two_cpu_processes_train_together(toy_data_bin, tmp_path):
    save_dir = tmp_path / "ddp"
    proc = run(["python3", REPO / "scripts" / "train.py", "--dataset", "sample-es-en", "--variant", "resi_dual",
                "--layers", "3", "--data", toy_data_bin, "--save-dir", save_dir, "--nprocs", "2",
                "--", *TINY, "--max-update", "2"], env=CLI_ENV)
    assert "training on 2 devices" in (save_dir / "train.log").read_text()
    assert (save_dir / "checkpoint_last.pt").is_file() and (save_dir / "train.rank1.log").is_file()
    assert "gloo" in proc.stdout


# --- own corpus at any depth, languages, threads, progress, tensorboard -------------------------------

def test_any_depth_and_asymmetric_depths_from_base_yaml(toy_data_bin, tmp_path):
    plan = train.plan(request(toy_data_bin, tmp_path / "ck", cpu=True).__class__(
        "iwslt14-de-en", "resi_dual", 5, toy_data_bin, tmp_path / "ck", cpu=True, decoder_layers=2))
    text = shlex.join(plan.commands[0])
    assert "--encoder-layers 5 --decoder-layers 2" in text and "--encoder-embed-dim 256" in text  # iwslt's base
    assert plan.model["encoder_layers"] == 5 and plan.model["decoder_layers"] == 2
    assert train.run_name("resi_dual", plan.model) == "resi_dual-5+2l"
    # fairseq flags after -- win over the config; the record says what the run really holds.
    plan = train.plan(request(toy_data_bin, tmp_path / "ck", cpu=True, extra_args=["--encoder-layers", "6",
                                                                                 "--decoder-layers=6"]))
    assert (plan.model["encoder_layers"], plan.model["decoder_layers"]) == (6, 6)
    path = train.write_run_record(request(toy_data_bin, tmp_path / "ck", extra_args=["--encoder-layers", "6",
                                                                                   "--decoder-layers=6"]), plan)
    record = json.loads(path.read_text())
    assert record["name"] == "resi_dual-6l" and (record["encoder_layers"], record["decoder_layers"]) == (6, 6)
    assert (record["source_lang"], record["target_lang"]) == ("src", "tgt") and record["threads"] >= 1


def test_a_language_models_depth_is_its_decoder_depth(tmp_path, capsys):
    """A language model has one stack: --decoder-layers alone is its depth, --encoder-layers
    is refused (not silently dropped), both refused before any data is read."""
    parser = train.build_parser()

    def depths(*flags):
        return train.depths(parser.parse_args(["--dataset", "sample-lm", "--variant", "resi_dual", "--data", "d",
                                               "--save-dir", "s", *flags]), parser)

    assert depths("--decoder-layers", "4") == depths("--layers", "4") == depths("--layers", "4",
                                                                              "--decoder-layers", "4") == (4, None)
    base = ["--dataset", "sample-lm", "--variant", "resi_dual", "--data", tmp_path / "none",
            "--save-dir", tmp_path / "ck", "--dry-run"]
    line = user_error(capsys, train.main, base + ["--encoder-layers", "9", "--decoder-layers", "4"])
    assert line == ("error: --encoder-layers: sample-lm trains a language model, which has no encoder; "
                    "give its depth with --layers or --decoder-layers")
    assert "has one stack, give its depth once" in user_error(capsys, train.main,
                                                             base + ["--layers", "6", "--decoder-layers", "4"])
    assert "the language model's depth" in user_error(capsys, train.main, base)
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "dict.txt").write_text("w1 1\n")
    with pytest.raises(UserError, match="one stack: layers 6 and decoder_layers 4 differ"):
        train.plan(train.TrainRequest("sample-lm", "resi_dual", 6, tmp_path / "lm", tmp_path / "ck", decoder_layers=4))
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("flags", [["--save-dir", "elsewhere"], ["--user-dir=/x"], ["--task", "translation"],
                                   ["-s", "tgt"], ["-tsrc"], ["--target_lang", "src"]])
def test_flags_the_driver_sets_itself_are_refused_after_the_separator(toy_data_bin, tmp_path, capsys, flags):
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3",
                                           "--data", toy_data_bin, "--save-dir", tmp_path / "ck", "--", *flags])
    given = flags[0].partition("=")[0] if flags[0].startswith("--") else flags[0][:2]
    assert line.startswith(f"error: {given} after --: residual-fairseq-train sets it itself"), line
    assert not (tmp_path / "ck").exists()


def test_restore_file_is_refused_after_the_separator(toy_data_bin, tmp_path, capsys):
    """fairseq would load that file at every start, never SAVE_DIR/checkpoint_last.pt."""
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3",
                                           "--data", toy_data_bin, "--save-dir", tmp_path / "ck", "--",
                                           "--restore-file=/other/checkpoint.pt"])
    assert line.startswith("error: --restore-file after --: residual-fairseq-train resumes from "
                           "SAVE_DIR/checkpoint_last.pt itself"), line
    assert not (tmp_path / "ck").exists()


def test_language_pair_is_inferred_from_the_data(toy_data_bin, tmp_path, capsys):
    # iwslt14-de-en's config names de-en; the toy data hold src-tgt: the data win, and the driver says so.
    iwslt = train.TrainRequest("iwslt14-de-en", "resi_dual", 6, toy_data_bin, tmp_path / "ck", cpu=True)
    plan = train.plan(iwslt)
    assert "--source-lang src --target-lang tgt" in shlex.join(plan.commands[0])
    assert any("holds src-tgt: training src->tgt" in note for note in plan.notes)
    reverse = train.plan(train.TrainRequest("iwslt14-de-en", "resi_dual", 6, toy_data_bin, tmp_path / "ck",
                                            cpu=True, source_lang="tgt"))
    assert "--source-lang tgt --target-lang src" in shlex.join(reverse.commands[0])
    train.main(["--dataset", "sample-es-en", "--variant", "post_ln", "--encoder-layers", "4", "--decoder-layers",
                "1", "--data", str(toy_data_bin), "-s", "src", "-t", "tgt", "--save-dir", str(tmp_path / "d"),
                "--threads", "3", "--dry-run"])
    out = capsys.readouterr().out
    assert "--encoder-layers 4 --decoder-layers 1" in out and "note: 3 CPU threads (--threads" in out


def test_threads_default_and_override(monkeypatch):
    from residual_fairseq import runtime

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("RESIDUAL_FAIRSEQ_THREADS", "2")
    assert runtime.resolve_threads() == (2, "RESIDUAL_FAIRSEQ_THREADS")
    assert runtime.resolve_threads(5) == (5, "--threads")
    monkeypatch.delenv("RESIDUAL_FAIRSEQ_THREADS")
    threads, source = runtime.resolve_threads()
    assert threads == max(1, min(8, runtime.available_cores() // 2)) and "cores" in source
    assert runtime.thread_environment(3)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("RESIDUAL_FAIRSEQ_THREADS", "99999")
    with pytest.raises(UserError, match="RESIDUAL_FAIRSEQ_THREADS=99999: at most 1024 threads"):
        runtime.resolve_threads()


def test_progress_bar_reads_fairseq_json_lines():
    import io

    stream = io.StringIO()
    display = train.ProgressDisplay(max_update=0, max_epoch=2, stream=stream)
    lines = [
        "2026-12-03 02:29:52 | INFO | fairseq.data.iterators | grouped total_num_itrs = 50\n",
        "2026-12-03 02:29:52 | INFO | fairseq_cli.train | a long config dump nobody reads\n",
        "/x/torch/nn/functional.py:6802: UserWarning: Support for mismatched key_padding_mask is deprecated.\n",
        "  key_padding_mask = _canonical_mask(\n",
        '2026-12-03 02:30:10 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "9.5", "lr": "0.001", '
        '"num_updates": "25"}\n',
        '2026-12-03 02:30:20 | INFO | valid | {"epoch": 1, "valid_loss": "8.25", "valid_num_updates": "50"}\n',
        "2026-12-03 02:30:21 | WARNING | fairseq.trainer | something worth seeing\n",
        "2026-12-03 02:30:22 | INFO | fairseq_cli.train | ResiDualModel(\n",
        "  (encoder): ResiDualEncoder(\n",
        "fairseq-train: error: argument --foo: bad\n",
        "Traceback (most recent call last):\n",
        "  File \"x.py\", line 1, in <module>\n",
        "RuntimeError: boom\n",
    ]
    for line in lines:
        display.feed(line)
    assert display.bar.total == 100 and display.bar.n == 25
    display.close()
    shown = stream.getvalue()
    assert "epoch 1 update 50: valid loss 8.25" in shown and "something worth seeing" in shown
    assert "config dump" not in shown and "UserWarning" not in shown and "_canonical_mask" not in shown
    assert "ResiDualEncoder" not in shown and "fairseq-train: error: argument --foo" in shown
    assert "Traceback" in shown and "RuntimeError: boom" in shown


@pytest.mark.slow
def test_tensorboard_logdir_writes_event_files(toy_data_bin, tmp_path):
    """tensorboardX is a dependency, so fairseq-train --tensorboard-logdir works (and fairseq no longer
    prints "Please install tensorboardX")."""
    from helpers import TINY_TRAIN_ARGS, USER_DIR, fairseq_cli

    proc = run([fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
                "--max-update", "2", "--no-save", "--tensorboard-logdir", tmp_path / "tb",
                "--save-dir", tmp_path / "ck"])
    assert "Please install tensorboardX" not in proc.stdout + proc.stderr
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events and any(path.stat().st_size > 100 for path in events)


# Loss is the metric and "higher is better": every validation after the first is worse
# (training lowers the loss), so patience counts them all and decides where a run stops.
PATIENCE_2 = ["--patience", "2", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"]


@pytest.mark.slow
def test_a_resumed_run_keeps_counting_patience(toy_data_bin, tmp_path):
    save_dir, log = tmp_path / "ck", tmp_path / "ck" / "train.log"
    base = ["python3", REPO / "scripts" / "train.py", "--dataset", "sample-es-en", "--variant", "resi_dual",
            "--layers", "2", "--data", toy_data_bin, "--save-dir", save_dir, "--", *TINY, "--max-update", "1000",
            *PATIENCE_2]
    # A count in the caller's environment is not handed on: it would stop this run at epoch 1.
    inherited = {**CLI_ENV, early_stopping.ENVIRONMENT_VARIABLE: json.dumps({"best": 1e9, "runs": 1})}
    run(base + ["--max-epoch", "2"], env=inherited)  # epoch 1 is the best, epoch 2 one validation since
    _, updates = train.resume_point(save_dir)
    state, _ = early_stopping.resumed_state(log, updates, maximize=True)
    assert state == {"best": validation_curve(log)[0]["loss"], "runs": 1}  # the logged numbers are fairseq's

    resumed = run(base + ["--max-epoch", "6"], env=CLI_ENV)
    assert "patience continues: best validation valid_loss" in resumed.stdout
    assert "1 validation(s) since" in resumed.stdout
    curve = validation_curve(log)
    assert [point["epoch"] for point in curve] == [1, 2, 3]  # fairseq alone would train to epoch 5
    assert max(curve, key=lambda point: point["loss"])["epoch"] == 1  # what the count relied on
    assert "hasn't improved for last 2 runs" in resumed.stdout

    # Run again, the stopped run is not trained further (fairseq would validate once more).
    again = run(base + ["--max-epoch", "6"], env=CLI_ENV)
    assert "2 validation(s) since" in again.stdout and "already stopped early" in again.stdout
    assert [point["epoch"] for point in validation_curve(log)] == [1, 2, 3]

    # Without the run's start in the log the count is not guessed: fairseq's own behaviour, said in one line.
    log.write_text(log.read_text().split("No existing checkpoint found")[1])
    state, line = early_stopping.resumed_state(log, updates)
    assert state is None and "does not show where this run started" in line and "patience restarts" in line
    assert early_stopping.environment(None) == {}


def _log_line(kind, text):
    return f"2026-01-01 00:00:00 | INFO | {kind} | {text}\n"


def _valid(updates, loss, subset="valid"):
    return _log_line(subset, json.dumps({"epoch": 1, f"{subset}_loss": str(loss),
                                         f"{subset}_num_updates": str(updates)}))


def test_the_count_replays_fairseqs_rule_over_this_runs_own_validations(tmp_path):
    """Ties do not improve; a validation without a save counts; an earlier run's lines in the
    same log, and validations a resume repeated, do not; damaged lines are not validations."""
    log = tmp_path / "train.log"
    fresh = _log_line("fairseq.trainer", "No existing checkpoint found /x/checkpoint_last.pt")
    log.write_text(
        fresh + _valid(2, 1.0) + _valid(4, 0.5)                       # an earlier run in this directory
        + fresh + _valid(2, 5.0) + _valid(4, 4.0) + _valid(6, 4.0)    # this run: a tie at 6
        + _valid(8, 4.2) + _valid(10, 3.9)                            # 10 was validated, then a crash
        + _log_line("fairseq.trainer", "Loaded checkpoint /x/checkpoint_last.pt (epoch 2 @ 8 updates)")
        + _valid(10, 4.1) + _valid(12, 4.3)                           # the resume's own update 10
        + _log_line("valid", '{"epoch": 1, "valid_loss": "1", "valid_num_updates": Infinity}')
        + _valid(14, 0.1))                                            # after the checkpoint resumed from
    history, started = training_log.run_validations(log, up_to_updates=12)
    assert started and history == [(2, 5.0), (4, 4.0), (6, 4.0), (8, 4.2), (10, 4.1), (12, 4.3)]
    state, line = early_stopping.resumed_state(log, 12)
    assert state == {"best": 4.0, "runs": 4} and "best validation valid_loss 4, 4 validation(s) since" in line
    assert early_stopping.replay([3.0, 5.0, 5.0, 4.0], maximize=True) == {"best": 5.0, "runs": 2}
    # A fine-tune's first start loads another model at update 0: the run starts there.
    log.write_text(_log_line("fairseq.trainer", "Loaded checkpoint /m.pt (epoch 1 @ 0 updates)") + _valid(3, 2.0))
    assert early_stopping.resumed_state(log, 3)[0] == {"best": 2.0, "runs": 0}


def test_fairseq_train_takes_the_count_only_from_a_well_formed_variable(monkeypatch):
    import fairseq_cli.train

    stop_early = fairseq_cli.train.should_stop_early
    for name in ("best", "num_runs"):
        monkeypatch.delattr(stop_early, name, raising=False)
    variable = early_stopping.ENVIRONMENT_VARIABLE
    assert not early_stopping.restore_in_fairseq_train({})
    for bad in ("{", '{"best": "nan", "runs": 1}', '{"best": 1.0, "runs": -1}', '{"best": 1.0}', "[]",
                '{"best": 1' + "0" * 400 + ', "runs": 1}'):  # an int too large for a float
        assert not early_stopping.restore_in_fairseq_train({variable: bad})
        assert not hasattr(stop_early, "best")
    monkeypatch.setattr(stop_early, "best", None, raising=False)  # restored by monkeypatch afterwards
    monkeypatch.setattr(stop_early, "num_runs", None, raising=False)
    assert early_stopping.restore_in_fairseq_train(early_stopping.environment({"best": 4.5, "runs": 3}))
    assert (stop_early.best, stop_early.num_runs) == (4.5, 3)


@pytest.mark.parametrize("name", ["train.log", ".residual-fairseq-train.lock", "run.json", ".run.json.tmp",
                                  "checkpoint_last.pt", "admin_profile.json"])
def test_a_link_planted_where_training_writes_is_refused(capsys, toy_data_bin, tmp_path, name):
    """The driver and fairseq open these names for writing: through a link they would write into
    whatever it points at (here a file of the user's, which must stay as it was)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    (save_dir / name).symlink_to(victim)
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "1",
                                           "--data", toy_data_bin, "--save-dir", save_dir])
    assert line == (f"error: {save_dir / name} is a symbolic link: training writes that file and would write "
                    "through the link; remove it, or choose another --save-dir")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("flag", ["--fp16", "--bf16", "--amp"])
def test_half_precision_after_the_dashes_is_refused_on_cpu(capsys, toy_data_bin, tmp_path, flag):
    """fairseq would stop on it only after starting (fp16: no CUDA; bf16 means a TPU on CPU)."""
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "1",
                                           "--data", toy_data_bin, "--save-dir", tmp_path / "save", "--cpu",
                                           "--", flag])
    assert line == f"error: {flag} after --: needs CUDA, and this run trains on CPU (--cpu)"
    assert not (tmp_path / "save").exists()


def test_a_seed_numpy_cannot_take_is_refused_when_parsed(capsys, toy_data_bin, tmp_path):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        train.main(["--dataset", "sample-es-en", "--variant", "resi_dual", "--data", str(toy_data_bin),
                    "--save-dir", str(tmp_path / "save"), "--seed", str(2 ** 31)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().endswith("argument --seed: must be at most 2147483647, got 2147483648")


def test_resuming_a_save_dir_as_another_model_is_refused_and_its_record_kept(capsys, toy_data_bin, tmp_path):
    """fairseq would load the checkpoints into the other model and fail, after run.json had been
    rewritten to describe a model the checkpoints are not."""
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(b"never read")
    record = json.dumps({"name": "resi_dual-1l", "variant": "resi_dual", "layers": 1})
    (save_dir / "run.json").write_text(record)
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "post_ln", "--layers", "2",
                                           "--data", toy_data_bin, "--save-dir", save_dir])
    assert line == (f"error: --save-dir {save_dir} holds checkpoints of a 'resi_dual-1l' run (its run.json), and "
                    "fairseq would resume them as post_ln-2l: choose another --save-dir")
    assert (save_dir / "run.json").read_text() == record


# What fairseq's train_step (fairseq/tasks/fairseq_task.py) runs: the line Python prints below its warning.
FAIRSEQ_TASK = '''import torch


class AMPOptimizer:
    pass


def train_step(optimizer):
    with torch.cuda.amp.autocast(enabled=(isinstance(optimizer, AMPOptimizer))):
        return 1
'''
# A fake fairseq-train: the two warnings torch prints from inside fairseq on every run, each
# raised for real (fairseq's autocast line; the attention call fairseq makes), then warnings
# the console must still show: another one, and the same autocast message from elsewhere.
FAKE_FAIRSEQ_TRAIN = '''import sys, warnings
warnings.simplefilter("default")  # as fairseq-train runs (not PYTHONWARNINGS=ignore)
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from fairseq.tasks.fairseq_task import train_step

train_step(object())
weight, bias = torch.randn(12, 4), torch.zeros(12)
F.multi_head_attention_forward(
    torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4), 4, 1, weight, bias, None, None, False, 0.0,
    torch.nn.Linear(4, 4).weight, None, key_padding_mask=torch.zeros(1, 2, dtype=torch.bool),
    attn_mask=torch.zeros(2, 2))
warnings.warn("a warning worth seeing")
with torch.cuda.amp.autocast(enabled=False):
    pass
print("| INFO | fairseq_cli.train | done", flush=True)
'''


@pytest.mark.slow
def test_known_fairseq_warnings_stay_in_train_log_and_off_the_console(tmp_path, capsys):
    fake = tmp_path / "fake"
    (fake / "fairseq" / "tasks").mkdir(parents=True)
    (fake / "fairseq" / "__init__.py").write_text("")
    (fake / "fairseq" / "tasks" / "__init__.py").write_text("")
    (fake / "fairseq" / "tasks" / "fairseq_task.py").write_text(FAIRSEQ_TASK)
    (fake / "fairseq_train.py").write_text(FAKE_FAIRSEQ_TRAIN)
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    fake_plan = train.TrainPlan([["python3", str(fake / "fairseq_train.py"), str(fake)]], [], {})
    assert train.execute(fake_plan, save_dir, progress=False) == 0
    console, log = capsys.readouterr().out, (save_dir / "train.log").read_text()
    autocast = "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated."
    mask = "UserWarning: Support for mismatched key_padding_mask and attn_mask is deprecated."
    # train.log keeps fairseq's output whole
    assert f"fairseq_task.py:9: {autocast}" in log and "  with torch.cuda.amp.autocast(enabled=(isinstance" in log
    assert mask in log and "  key_padding_mask = _canonical_mask(" in log
    # the console: neither known warning nor its source line; everything else as it came
    assert "fairseq_task.py" not in console and "isinstance(optimizer, AMPOptimizer)" not in console
    assert mask not in console and "_canonical_mask" not in console
    assert "UserWarning: a warning worth seeing" in console
    assert f"fairseq_train.py:15: {autocast}" in console  # the same message, from elsewhere
    assert "  with torch.cuda.amp.autocast(enabled=False):" in console
    assert console.rstrip().endswith("| INFO | fairseq_cli.train | done")
    assert len(log.splitlines()) - len(console.splitlines()) == 4


def test_only_the_known_warnings_source_line_is_dropped_after_it():
    from residual_fairseq.train.progress import ConsoleFilter

    header = ("/site-packages/torch/nn/functional.py:6802: UserWarning: Support for mismatched key_padding_mask "
              "and attn_mask is deprecated. Use same type for both instead.\n")
    lines = [header, "2026-12-03 02:30:10 | INFO | train_inner | {}\n",  # no source line (no source file)
             header, "  key_padding_mask = _canonical_mask(\n", "  key_padding_mask = _canonical_mask(\n",
             header.replace("Use same type", "Use one type"),  # another message: shown
             header.replace("torch/nn/functional.py", "mine/functional.py")]  # from elsewhere: shown
    console = ConsoleFilter()
    assert [line for line in lines if console.shows(line)] == [lines[1], lines[4], lines[5], lines[6]]
