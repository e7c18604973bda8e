"""residual-fairseq-reproduce: a 2-variant matrix on the sample corpus, end to end, then skipped."""
import csv
import fcntl
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CLI_ENV, REPO, markdown_rows, run, user_error
from residual_fairseq import reproduce
from residual_fairseq.reproduce import records as run_records, report
from residual_fairseq.training_log import validation_curve

# Seconds per run: a few updates, two validations (for a curve), short greedy decoding.
FAIRSEQ_FLAGS = ["--max-update", "4", "--validate-interval-updates", "2", "--max-tokens", "1024", "--max-valid-steps", "1",
                 "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 6}', "--no-epoch-checkpoints"]


def test_validation_curve_parses_fairseq_json_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        '2026-01-01 00:00:00 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "num_updates": "2"}\n'
        '2026-01-01 00:00:01 | INFO | valid | {"epoch": 1, "valid_loss": "8.5", "valid_bleu": "1.25", '
        '"valid_num_updates": "2"}\n'
        '2026-01-01 00:00:02 | INFO | valid | {"epoch": 1, "valid_loss": "7.5", "valid_num_updates": "4"}\n')
    assert validation_curve(log) == [
        {"epoch": 1, "updates": 2, "loss": 8.5, "bleu": 1.25}, {"epoch": 1, "updates": 4, "loss": 7.5, "bleu": None}]
    assert report.mean_std([1.0, 3.0]) == (2.0, 2 ** 0.5) and report.mean_std([5.0]) == (5.0, None)


def test_how_training_ended_reads_the_last_session_of_the_log(tmp_path):
    log = tmp_path / "train.log"
    start = "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
    done = "2026-01-01 00:00:09 | INFO | fairseq_cli.train | done training in 9.0 seconds\n"
    early = ("2026-01-01 00:00:08 | INFO | fairseq_cli.train | early stop since valid performance hasn't "
             "improved for last 5 runs\n")
    assert run_records.how_training_ended(tmp_path / "missing.log") is None
    for text, expected in ((start, None), (start + done, "budget"), (start + early + done, "patience 5"),
                           (start + early + done + start, None), (start + early + done + start + done, "budget")):
        log.write_text(text)
        assert run_records.how_training_ended(log) == expected, text


def test_run_records_show_every_run_as_it_stands(tmp_path):
    """runs.md/runs.json: a finished run with its best epoch and test numbers, a run in
    progress with its validations so far, a failed one with its error, one not started."""
    finished, going, failed, waiting = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out",
                                                        ["post_ln", "resi_dual", "b2t", "admin"], layers=[6])
    log = ('x | INFO | valid | {"epoch": 1, "valid_loss": "6.5", "valid_num_updates": "698"}\n'
           'x | INFO | valid | {"epoch": 2, "valid_loss": "5.25", "valid_num_updates": "1396"}\n'
           'x | INFO | valid | {"epoch": 3, "valid_loss": "5.25", "valid_num_updates": "2094"}\n'
           'x | INFO | valid | {"epoch": 4, "valid_loss": "5.5", "valid_num_updates": "2792"}\n'
           "x | INFO | fairseq_cli.train | early stop since valid performance hasn't improved for last 1 runs\n")
    for run_ in (finished, going, failed):
        run_.save_dir.mkdir(parents=True)
    (finished.save_dir / "train.log").write_text(log)
    (going.save_dir / "train.log").write_text(log.splitlines(keepends=True)[0])
    (failed.failure_path).write_text(json.dumps({"error": "fairseq-train exited 1"}))
    (finished.result_path).write_text(json.dumps({
        "checkpoint": str(finished.save_dir / "checkpoint_best.pt"), "generation": {"beam": 5},
        "sacrebleu": {"score": 19.814, "signature": "nrefs:1|tok:13a"}, "chrf": {"score": 41.29},
        "tokenized_bleu": {"score": 14.79}}))
    records = [run_records.run_record(run_) for run_ in (finished, going, failed, waiting)]
    assert [record["status"] for record in records] == ["finished", "unfinished", "failed", "not started"]
    assert {key: records[0][key] for key in ("epochs", "ended_by", "best_valid_loss", "best_epoch", "test_bleu",
                                             "beam", "checkpoint")} == {
        "epochs": 4, "ended_by": "patience 1", "best_valid_loss": 5.25, "best_epoch": 3, "test_bleu": 19.814,
        "beam": 5, "checkpoint": "checkpoint_best.pt"}
    assert [point["updates"] for point in records[1]["validations"]] == [698] and "test_bleu" not in records[1]
    assert records[2]["error"] == "fairseq-train exited 1"
    table = report.runs_markdown(records).splitlines()
    assert table[0].endswith("| best valid loss (epoch) | test sacreBLEU | test chrF | test tok. BLEU |")
    # checkpoint_best.pt holds the last of equal bests (fairseq rewrites it on a tie)
    assert table[2] == "| sample-es-en | post_ln | 6 | 1 | finished | 4 (patience 1) | 5.250 (3) | 19.81 | 41.29 | 14.79 |"
    assert table[3] == "| sample-es-en | resi_dual | 6 | 1 | unfinished | 1 (-) | 6.500 (1) | - | - | - |"
    assert table[5] == "| sample-es-en | admin | 6 | 1 | not started | - | - | - | - | - |"


def test_matrix_runs_tabulates_and_skips_finished_runs(sample_prepared, tmp_path):  # noqa: F811
    """Two real runs with --jobs 2 (the sequential path runs end to end in test_lm_cli.py):
    both start before either ends, each driver's output goes to its run's reproduce.log,
    the tables hold both, and a rerun skips them."""
    out = tmp_path / "results"
    command = ["python3", REPO / "scripts" / "reproduce.py", "--dataset", "sample-es-en",
               "--data", sample_prepared / "bin", "--variants", "post_ln", "resi_dual", "--layers", "3",
               "--out", out, "--beam", "1", "--generate-args", "--max-len-a 0 --max-len-b 6 --max-tokens 2048",
               "--jobs", "2"]
    dry = run(command + ["--dry-run", "--", *FAIRSEQ_FLAGS], env=CLI_ENV)
    command += ["--", *FAIRSEQ_FLAGS]
    assert dry.stdout.count("would run:") == 2 and dry.stdout.count("would evaluate:") == 2
    assert not (out / "results.md").exists()

    first = run(command, env=CLI_ENV)
    assert "2 runs (0 finished)" in first.stdout
    events = [line.split(" (log")[0].split(" in ")[0] for line in _lines_with(first.stdout, "started ", "finished ")]
    assert events[:2] == ["started sample-es-en post_ln 3L seed 1", "started sample-es-en resi_dual 3L seed 1"]
    assert sorted(events[2:]) == ["finished sample-es-en post_ln 3L seed 1", "finished sample-es-en resi_dual 3L seed 1"]
    finished = out / "runs" / "sample-es-en" / "resi_dual-3l" / "seed1"
    assert json.loads((finished / "run.json").read_text())["threads"] == reproduce.threads_per_job(2)
    assert "=== sample-es-en resi_dual 3L seed 1" in (finished / "reproduce.log").read_text()
    table = (out / "results.md").read_text()
    assert "| sample-es-en | post_ln | 3 | 1 |" in table and "| sample-es-en | resi_dual | 3 | 1 |" in table
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [row["variant"] for row in rows] == ["post_ln", "resi_dual"]
    for row in rows:
        assert float(row["test_bleu_mean"]) >= 0 and float(row["last_valid_loss_mean"]) > 0
        assert 0 < float(row["best_valid_loss_mean"]) <= float(row["last_valid_loss_mean"])
    runs_table = (out / "runs.md").read_text()
    assert runs_table.count("| finished | ") == 2 and "| sample-es-en | resi_dual | 3 | 1 | finished |" in runs_table
    records = json.loads((out / "runs.json").read_text())
    assert [(record["variant"], len(record["validations"])) for record in records] == [("post_ln", 2), ("resi_dual", 2)]
    png = (out / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    for variant in ("post_ln", "resi_dual"):
        save_dir = out / "runs" / "sample-es-en" / f"{variant}-3l" / "seed1"
        assert len(validation_curve(save_dir / "train.log")) == 2
        assert (save_dir / "result.json").is_file()

    again = run(command, env=CLI_ENV)
    assert "2 runs (2 finished)" in again.stdout and again.stdout.count("skip sample-es-en") == 2
    assert "running:" not in again.stdout


def test_any_depth_last_checkpoint_fallback_and_a_failed_run_in_the_table(tmp_path, monkeypatch, capsys):
    """--layers takes depths the dataset does not ship; a run without checkpoint_best.pt (trained with
    --disable-validation) is evaluated on checkpoint_last.pt, saying so; a failing run is reported in the
    table while the others go on."""
    from residual_fairseq import train
    from residual_fairseq.errors import UserError

    runs = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["post_ln", "resi_dual"],
                            layers=[5], seeds=[1])
    assert [run.save_dir.parent.name for run in runs] == ["post_ln-5l", "resi_dual-5l"]

    def fake_train(request, dry_run=False):
        if request.variant == "post_ln":
            raise UserError("fairseq-train exited 1 (log: somewhere)")
        request.save_dir.mkdir(parents=True)
        (request.save_dir / "checkpoint_last.pt").write_bytes(b"model")
        (request.save_dir / "train.log").write_text(
            '2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "7.5", "valid_num_updates": "4"}\n')

    evaluated = []

    def fake_evaluate(checkpoint, data, out_json=None, **options):
        evaluated.append(checkpoint)
        result = {"sacrebleu": {"score": 12.5}, "chrf": {"score": 40.0}, "tokenized_bleu": {"score": 13.0}}
        out_json.write_text(json.dumps(result))
        return result

    monkeypatch.setattr(train, "train", fake_train)
    monkeypatch.setattr(reproduce.schedule, "evaluate_run", fake_evaluate)
    monkeypatch.setattr(reproduce.schedule, "evaluation_options", lambda run: {})
    with pytest.raises(UserError, match="1 of 2 runs failed"):
        reproduce.reproduce(runs, tmp_path / "out")
    out = capsys.readouterr().out
    assert "error: sample-es-en post_ln 5L seed 1 failed: fairseq-train exited 1" in out
    assert "has no checkpoint_best.pt (trained without validation?): evaluating checkpoint_last.pt" in out
    assert evaluated == [runs[1].save_dir / "checkpoint_last.pt"]
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| sample-es-en | post_ln | 5 | - | - | - | - | - | - | - | - | seed 1: fairseq-train exited 1" in table
    assert "| sample-es-en | resi_dual | 5 | 1 | 12.50 | 40.00 | 13.00 | - | 7.50 | 7.50 | - | - |" in table


def test_a_jobs_child_is_the_same_run(tmp_path):
    """--jobs starts this CLI once per run: its arguments must name exactly that run, with the
    same data directory (even one with '=' in its path), flags and decoding."""
    from residual_fairseq import train

    data = tmp_path / "a=b" / "bin"
    [run_] = reproduce.matrix({"sample-es-en": data}, tmp_path / "out", ["b2t"], layers=[7], seeds=[3])
    command = reproduce.driver_command(run_, 1, ["--max-epoch", "2"], {"beam": 2, "generate_args": ["--max-len-b", "9"]},
                                       threads=1, verbose=False)
    assert command[1:3] == ["-m", "residual_fairseq.reproduce"]
    ours, passthrough = train.split_passthrough(command[3:])
    args = reproduce.build_parser().parse_args(ours)
    assert passthrough == ["--max-epoch", "2"] and args.no_report and args.threads == 1
    assert (args.beam, args.generate_args) == (2, ["--max-len-b", "9"])
    assert reproduce.matrix(reproduce.parse_data(args.data, args.dataset), Path(args.out), args.variants,
                            args.layers, args.seeds) == [run_]
    assert reproduce.threads_per_job(3, threads=5) == 5 and reproduce.threads_per_job(10 ** 6) == 1
    # A one-word --generate-args value that starts with "-" stays the value, not a flag of its own.
    command = reproduce.driver_command(run_, 1, [], {"generate_args": ["--no-repeat-ngram-size=3"]}, threads=1,
                                       verbose=False)
    ours, _ = train.split_passthrough(command[3:])
    assert reproduce.build_parser().parse_args(ours).generate_args == ["--no-repeat-ngram-size=3"]


@pytest.mark.parametrize("flags", [["--arch", "resi_dual_lm"], ["--arch=transformer"], ["--save-dir", "x"],
                                   ["--user-dir", "x"], ["--seed", "3"], ["--decoder-normalize-before"],
                                   ["--admin-profile", "p.json"], ["-s", "en"]])
def test_flags_the_driver_sets_itself_are_refused_after_the_separator(tmp_path, capsys, flags):
    """A run named post_ln-3l seed 1 must be that: flags after -- that the driver sets itself
    are one line, before anything is trained or written."""
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin",
                                               "--variants", "post_ln", "--layers", "3", "--out", tmp_path / "out",
                                               "--", "--max-update", "2", *flags])
    given = flags[0].partition("=")[0]
    assert line.startswith(f"error: {given} after --: residual-fairseq-reproduce sets it itself"), line
    assert not (tmp_path / "out").exists()


def test_language_model_evaluation_takes_generate_args_and_refuses_beam(tmp_path, capsys):
    """For language models --generate-args are fairseq-eval-lm's extra flags; --beam, a flag
    the evaluation sets itself, or flags meant for fairseq-generate too, are one line."""
    [run_] = reproduce.matrix({"sample-lm": tmp_path / "sample-lm" / "bin"}, tmp_path / "out", ["resi_dual"], [2])
    reproduce.evaluate_language_model(run_, {"generate_args": ["--output-word-probs"]}, dry_run=True)
    out = capsys.readouterr().out
    assert out.startswith("would evaluate: ") and out.rstrip().endswith("--output-word-probs"), out
    assert "--context-window 64 " in out  # the dataset's own settings stay
    base = ["--dataset", "sample-lm", "--data", tmp_path / "sample-lm" / "bin", "--out", tmp_path / "out"]
    assert "--beam: sample-lm is a language-model dataset, scored by perplexity" in \
        user_error(capsys, reproduce.main, base + ["--beam", "3"])
    line = user_error(capsys, reproduce.main, base + ["--generate-args=--context-window=0"])
    assert line.startswith("error: --context-window in the extra fairseq-eval-lm arguments: the evaluation sets it")
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-lm", "sample-es-en", "--data", "sample-lm=a",
                                               "sample-es-en=b", "--out", tmp_path / "out",
                                               "--generate-args", "--max-len-b 5"])
    assert "--generate-args with both translation and language-model datasets (sample-lm)" in line
    with pytest.raises(reproduce.UserError, match="--lenpen: sample-lm is a language-model dataset"):
        reproduce.reproduce([run_], tmp_path / "out", eval_overrides={"lenpen": 0.6})
    # Translation: fairseq-generate flags the evaluation sets itself, refused before anything trains.
    for extra, flag in (("--beam 1", "--beam"), ("--gen-subset=valid", "--gen-subset"), ("--lenpen 0.6", "--lenpen"),
                        ("--results-path r", "--results-path")):
        line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--out",
                                                   tmp_path / "out", f"--generate-args={extra}"])
        assert line == (f"error: {flag} in --generate-args: the evaluation sets it itself (reproduce offers --beam; "
                        "for other settings, evaluate a run directory with residual-fairseq-evaluate)"), line
    # ... and those after which fairseq-generate prints no test translation (issue 38: 99.98 BLEU in the tables)
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--out",
                                               tmp_path / "out", "--generate-args=--score-reference"])
    assert line.startswith("error: --score-reference in --generate-args: fairseq-generate would then print no test "
                           "translation"), line
    # -s/-t are not the evaluation's: they pick a direction of a data-bin that holds both
    from residual_fairseq.evaluate import check_generate_extra_args

    check_generate_extra_args(["-s", "en", "-t", "es", "--max-len-b", "50"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_jobs_child_imports_this_residual_fairseq_installed_or_not(tmp_path):
    """python scripts/reproduce.py works from a source checkout without installing: the
    runs' drivers must import that checkout's package, not another one installed."""
    env = reproduce.driver_environment({**CLI_ENV, "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/elsewhere"]
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "residual_fairseq", checkout / "residual_fairseq",
                    ignore=shutil.ignore_patterns("__pycache__"))
    parent = (f"import subprocess, sys; sys.path.insert(0, {str(checkout)!r}); from residual_fairseq import reproduce; "
              "print(subprocess.run([sys.executable, '-c', 'import residual_fairseq.reproduce as r; print(r.__file__)'], "
              "env=reproduce.driver_environment(), capture_output=True, text=True).stdout)")
    imported = subprocess.run([sys.executable, "-c", parent], env=CLI_ENV, cwd=tmp_path, capture_output=True, text=True)
    assert imported.stdout.strip() == str(checkout / "residual_fairseq" / "reproduce" / "__init__.py"), imported.stderr[-2000:]


def _finished(run_, bleu, chrf):
    run_.save_dir.mkdir(parents=True, exist_ok=True)
    run_.result_path.write_text(json.dumps({"sacrebleu": {"score": bleu}, "chrf": {"score": chrf}}))


def _lines_with(text, *starts):
    return [line for line in text.splitlines() if line.startswith(starts)]


def test_a_jobs_run_that_cannot_start_fails_alone(sample_prepared, tmp_path):  # noqa: F811
    """--jobs 2: a run whose directory another training holds fails with that reason in its
    failed.json and the table, the finished run beside it is skipped and tabulated, exit 2."""
    out = tmp_path / "results"
    locked, done = reproduce.matrix({"sample-es-en": sample_prepared / "bin"}, out, ["post_ln", "resi_dual"],
                                    layers=[3])
    locked.save_dir.mkdir(parents=True)
    _finished(done, 12.5, 40.0)
    holder = os.open(locked.save_dir / ".residual-fairseq-train.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        result = run(["python3", REPO / "scripts" / "reproduce.py", "--dataset", "sample-es-en",
                      "--data", sample_prepared / "bin", "--variants", "post_ln", "resi_dual", "--layers", "3",
                      "--out", out, "--jobs", "2"], check=False)
    finally:
        os.close(holder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: 1 of 2 runs failed" in result.stderr
    events = [line.split(" (")[0].split(" failed")[0]
              for line in _lines_with(result.stdout, "skip ", "started ", "finished ", "error: ")]
    assert events == ["skip sample-es-en resi_dual 3L seed 1: finished", "started sample-es-en post_ln 3L seed 1",
                      "error: sample-es-en post_ln 3L seed 1"]
    assert "is in use by another training run" in locked.failure_path.read_text()
    assert not (locked.save_dir / "checkpoint_last.pt").exists()
    table = (out / "results.md").read_text()
    assert "| sample-es-en | resi_dual | 3 | 1 | 12.50 | 40.00 |" in table and "seed 1: " in table


def test_jobs_stop_together_on_sigterm(sample_prepared, tmp_path):  # noqa: F811
    """SIGTERM to the driver stops every running run (no process of theirs is left, their
    directories are free again), records no failure, and the driver dies by SIGTERM."""
    out = tmp_path / "results"
    driver = subprocess.Popen(
        ["python3", str(REPO / "scripts" / "reproduce.py"), "--dataset", "sample-es-en", "--data",
         str(sample_prepared / "bin"), "--variants", "post_ln", "resi_dual", "--layers", "2", "--out", str(out),
         "--jobs", "2", "--", "--max-update", "100000", "--max-tokens", "1024"],
        env=CLI_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    save_dirs = [out / "runs" / "sample-es-en" / f"{variant}-2l" / "seed1" for variant in ("post_ln", "resi_dual")]
    deadline = time.monotonic() + 300
    while not all((save_dir / "train.log").is_file() for save_dir in save_dirs):  # fairseq-train has started
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.5)
    driver.send_signal(signal.SIGTERM)
    output, _ = driver.communicate(timeout=120)
    assert driver.returncode == -signal.SIGTERM, output
    assert output.count("stopped sample-es-en") == 2 and "error:" not in output
    for save_dir in save_dirs:
        assert not (save_dir / "failed.json").exists()
        lock = os.open(save_dir / ".residual-fairseq-train.lock", os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # every fairseq-train holding it is gone
        finally:
            os.close(lock)
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert left == []


@pytest.mark.parametrize("content, problem", [
    ("garbage{", "cannot be read (JSONDecodeError)"),
    ("[1, 2]", "has no numeric sacrebleu.score, chrf.score"),
    ('{"sacrebleu": {"score": "19.8"}, "chrf": {"score": 41.3}}', "has no numeric sacrebleu.score"),
    ('{"sacrebleu": {"score": 19.8}, "chrf": {"score": NaN}}', "has no numeric chrf.score"),
    # Numbers and fields a runs.json record could not hold (--finished-runs would refuse it).
    ('{"sacrebleu": {"score": 1e308}, "chrf": {"score": 5}}', "has no sacrebleu.score from 0 to 100"),
    ('{"sacrebleu": {"score": -1}, "chrf": {"score": 5}}', "has no sacrebleu.score from 0 to 100"),
    ('{"sacrebleu": {"score": 5}, "chrf": {"score": 101}}', "has no chrf.score from 0 to 100"),
    ('{"sacrebleu": {"score": 5}, "chrf": {"score": 5}, "tokenized_bleu": {"score": 1e300}}',
     "has no tokenized_bleu.score from 0 to 100"),
    ('{"sacrebleu": {"score": 5, "signature": [1]}, "chrf": {"score": 5}}', "has an odd sacrebleu.signature"),
    ('{"sacrebleu": {"score": 5}, "chrf": {"score": 5}, "generation": {"beam": "zz"}}', "has an odd generation.beam"),
    ('{"sacrebleu": {"score": 5}, "chrf": {"score": 5}, "checkpoint": "a\\nb.pt"}', "has an odd checkpoint"),
    pytest.param("[" * 100000, "cannot be read (RecursionError)", id="deeply-nested"),
])
def test_a_result_file_that_is_not_ours_is_one_line(tmp_path, capsys, content, problem):
    """A finished run's result.json feeds every table: one that evaluation did not write
    (edited, damaged) is named in one line, instead of a traceback from inside the tables."""
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["post_ln"], layers=[2])
    run_.save_dir.mkdir(parents=True)
    run_.result_path.write_text(content)
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants",
                                               "post_ln", "--layers", "2", "--out", tmp_path / "out", "--report-only"],
                      only_line=True)
    assert line == (f"error: {run_.result_path} {problem}: it is not a result this tool wrote; "
                    "delete it to evaluate the run again")


def test_odd_fields_of_a_result_and_damaged_log_lines_do_not_break_the_tables(tmp_path):
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["post_ln"], layers=[2])
    run_.save_dir.mkdir(parents=True)
    run_.result_path.write_text('{"sacrebleu": {"score": 1.5}, "chrf": {"score": 3}, "tokenized_bleu": 7, '
                                '"generation": [1], "checkpoint": 5}')
    (run_.save_dir / "train.log").write_text(
        'x | INFO | valid | {"epoch": 1, "valid_loss": "oops", "valid_num_updates": "2"}\n'
        'x | INFO | valid | {"epoch": 1, "valid_num_updates": "2"}\n'
        'x | INFO | valid | {not json}\n'
        'x | INFO | valid | {"epoch": 2, "valid_loss": "4.5", "valid_num_updates": "4"}\n')
    paths = report.write_reports([run_], tmp_path / "out")
    [record] = json.loads(paths["runs_json"].read_text())
    assert (record["test_bleu"], record["test_tok_bleu"], record["beam"], record["checkpoint"]) == (1.5, None, None, "5")
    assert [point["loss"] for point in record["validations"]] == [4.5]


@pytest.mark.parametrize("content, shown", [
    ("[1]", "failed"), ('"str"', "failed"), ('{"error": 5}', "failed"),
    (json.dumps({"error": "fairseq-train exited 1:\nline two | three\r\u2028four"}),
     "fairseq-train exited 1: line two / three four"),
])
def test_a_failed_json_that_is_not_ours_is_failed_on_one_table_line(tmp_path, capsys, content, shown):
    """failed.json is read as hostile: one that is not an object with an error string reads as
    "failed" (no traceback), and its error never breaks a markdown row (newlines, '|')."""
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["resi_dual"], layers=[1])
    run_.save_dir.mkdir(parents=True)
    run_.failure_path.write_text(content)
    reproduce.main(["--dataset", "sample-es-en", "--data", str(tmp_path / "sample-es-en" / "bin"), "--variants", "resi_dual",
                    "--layers", "1", "--seeds", "1", "--out", str(tmp_path / "out"), "--report-only"])
    table = (tmp_path / "out" / "results.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| sample-es-en")]
    assert len(rows) == 1 and rows[0].endswith(f"| seed 1: {shown} |")
    assert rows[0].count("|") == table[0].count("|")
    [record] = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert (record["status"], record["error"]) == ("failed", shown)


def test_a_diverged_validation_stays_out_of_runs_json(tmp_path, capsys):
    """A nan (or inf) validation loss once went into runs.json as NaN (not JSON; --finished-runs
    refused the file) and made the best loss depend on where it fell: such validations are
    left out of the curve, a bleu out of range is None, and runs.json loads again."""
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["resi_dual"], layers=[1])
    _finished(run_, 12.5, 40.0)
    (run_.save_dir / "train.log").write_text(
        'x | INFO | valid | {"epoch": 1, "valid_loss": "nan", "valid_num_updates": "2"}\n'
        'x | INFO | valid | {"epoch": 2, "valid_loss": "4.5", "valid_bleu": "nan", "valid_num_updates": "4"}\n'
        'x | INFO | valid | {"epoch": 3, "valid_loss": "inf", "valid_num_updates": "6"}\n'
        'x | INFO | valid | {"epoch": 4, "valid_loss": "5.5", "valid_bleu": "2.5", "valid_num_updates": "8"}\n'
        'x | INFO | valid | {"epoch": -1, "valid_loss": "3.5", "valid_num_updates": "10"}\n')
    argv = ["--dataset", "sample-es-en", "--data", str(tmp_path / "sample-es-en" / "bin"), "--variants", "resi_dual", "--layers", "1",
            "--seeds", "1", "--report-only"]
    reproduce.main(argv + ["--out", str(tmp_path / "out")])

    def refuse_constant(name):
        raise AssertionError(f"{name} in runs.json")

    [record] = json.loads((tmp_path / "out" / "runs.json").read_text(), parse_constant=refuse_constant)
    assert (record["best_valid_loss"], record["best_epoch"], record["epochs"]) == (4.5, 2, 4)
    assert record["validations"] == [{"epoch": 2, "updates": 4, "loss": 4.5, "bleu": None},
                                     {"epoch": 4, "updates": 8, "loss": 5.5, "bleu": 2.5}]
    shutil.copy(tmp_path / "out" / "runs.json", tmp_path / "part.json")
    reproduce.main(argv + ["--out", str(tmp_path / "again"), "--finished-runs", str(tmp_path / "part.json")])
    assert json.loads((tmp_path / "again" / "runs.json").read_text()) == [record]


def test_a_seed_fairseq_cannot_take_is_refused_at_once(tmp_path, capsys, seed="4294967296"):
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants",
                                               "resi_dual", "--layers", "1", "--seeds", seed, "--out",
                                               tmp_path / "out", "--dry-run"])
    assert "argument --seeds: must be" in line and not (tmp_path / "out").exists()


def test_evaluation_reads_only_a_manifest_that_prepare_wrote(tmp_path):
    """The manifest beside the data says how to remove subwords before scoring: another
    tool's manifest.json is ignored (the config decides), a damaged one of ours is one line."""
    from residual_fairseq.errors import UserError

    (tmp_path / "sample-es-en" / "bin").mkdir(parents=True)
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["post_ln"], layers=[2])
    from_config = reproduce.evaluation_options(run_)
    manifest = {"format": 1, "dataset": "sample-es-en", "source_lang": "es", "target_lang": "en",
                "settings": {"tokenizer": "moses"}, "subword": {"method": "spm-bpe"}, "files": {}}
    from residual_fairseq.data.prepared import MANIFEST_FORMAT
    manifest["format"] = MANIFEST_FORMAT
    (tmp_path / "sample-es-en" / "manifest.json").write_text(json.dumps(manifest))
    assert reproduce.evaluation_options(run_) == {**from_config, "subword": "spm-bpe", "detok_lang": "en"}
    (tmp_path / "sample-es-en" / "manifest.json").write_text('{"name": "some other tool"}')
    assert reproduce.evaluation_options(run_) == from_config
    for damaged, message in (("garbage", "is not a readable manifest"),
                             (json.dumps({**manifest, "subword": {"method": {"x": 1}}}), "names no subword method")):
        (tmp_path / "sample-es-en" / "manifest.json").write_text(damaged)
        with pytest.raises(UserError, match=message):
            reproduce.evaluation_options(run_)


def test_results_say_which_differences_are_beyond_seed_noise(tmp_path):
    """Each variant against the best by Welch's t-test over its seeds, checked against the
    test written out by hand; a variant with one seed is left out."""
    from scipy.stats import t as student_t

    bleu = {"resi_dual": [20.0, 21.0, 22.5], "post_ln": [10.0, 11.0, 12.0], "pre_ln": [19.5, 21.5, 20.0],
            "b2t": [30.0]}
    runs = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", list(bleu), layers=[6],
                            seeds=[1, 2, 3])
    for run_ in runs:
        if run_.seed <= len(bleu[run_.variant]):
            _finished(run_, bleu[run_.variant][run_.seed - 1], chrf=40.0)
    rows = {(row["metric"], row["variant"]): row for row in report.seed_noise(runs)}
    assert set(rows) == {("test sacreBLEU", "post_ln"), ("test sacreBLEU", "pre_ln"),
                         ("test chrF", "post_ln"), ("test chrF", "pre_ln")}

    def welch_p(a, b):
        (ma, sa), (mb, sb) = report.mean_std(a), report.mean_std(b)
        va, vb = sa ** 2 / len(a), sb ** 2 / len(b)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        return 2 * student_t.sf(abs(ma - mb) / (va + vb) ** 0.5, df)

    for variant, verdict in (("post_ln", "beyond seed noise"), ("pre_ln", "within seed noise")):
        row = rows[("test sacreBLEU", variant)]
        assert row["best"] == "resi_dual" and row["verdict"] == verdict
        assert abs(row["p"] - welch_p(bleu["resi_dual"], bleu[variant])) < 1e-9
        assert abs(row["difference"] - (sum(bleu[variant]) - sum(bleu["resi_dual"])) / 3) < 1e-9
    assert rows[("test chrF", "pre_ln")]["verdict"] == "no spread to test"  # every seed's chrF is the same
    table = report.write_reports(runs, tmp_path / "out")["markdown"].read_text()
    assert "Welch's t-test over the seeds" in table
    assert "| sample-es-en | 6 | test sacreBLEU | resi_dual | post_ln | -10.17 |" in table


def test_seeds_that_did_not_learn_are_named_apart_from_the_means(tmp_path):
    """A finished seed scoring below 1 sacreBLEU where other runs of its dataset and depth
    score more (a run that became a target-side language model) is named in "did not
    learn" and left out of mean ± std and the seed-noise test."""
    bleu = {"post_ln": [16.0, 0.09, 18.0], "resi_dual": [20.0, 21.0, 22.5]}
    runs = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", list(bleu), layers=[6],
                            seeds=[1, 2, 3])
    for run_ in runs:
        _finished(run_, bleu[run_.variant][run_.seed - 1], chrf=40.0)
    rows = {row["variant"]: row for row in report.summarize(runs)}
    assert rows["post_ln"]["seeds"] == "1 3" and rows["post_ln"]["test_bleu_mean"] == 17.0
    assert rows["post_ln"]["did_not_learn"] == "seed 2 (0.09 BLEU)" and rows["resi_dual"]["did_not_learn"] == ""
    noise = [row for row in report.seed_noise(runs) if row["metric"] == "test sacreBLEU"]
    assert [row["variant"] for row in noise] == ["post_ln"]
    assert abs(noise[0]["difference"] - (17.0 - 21.166666666666668)) < 1e-9  # over seeds 1 and 3 only
    paths = report.write_reports(runs, tmp_path / "out")
    table = paths["markdown"].read_text()
    assert "| test sacreBLEU | test chrF |" in table and "| did not learn | failed |" in table
    assert "| sample-es-en | post_ln | 6 | 1 3 | 17.00 ± 1.41 |" in table and "| seed 2 (0.09 BLEU) | - |" in table
    assert "did_not_learn,failed" in paths["csv"].read_text().splitlines()[0]
    statuses = [record["status"] for record in json.loads(paths["runs_json"].read_text())]
    assert statuses.count("finished, did not learn") == 1 and statuses.count("finished") == 5

    # A short budget where no run reaches 1 BLEU (the quick end-to-end check): none is set apart.
    for run_ in runs:
        _finished(run_, 0.2 + run_.seed / 10, chrf=10.0)
    rows = {row["variant"]: row for row in report.summarize(runs)}
    assert rows["post_ln"]["seeds"] == "1 2 3" and rows["post_ln"]["did_not_learn"] == ""
    assert abs(rows["post_ln"]["test_bleu_mean"] - 0.4) < 1e-9


@pytest.mark.slow
def test_a_driver_imports_everything_it_evaluates_with_when_it_starts():
    """Runs take hours: a package update meanwhile must not leave the driver importing new
    modules beside its old ones at the first evaluation (that killed a driver once)."""
    import subprocess
    import sys

    code = ("import sys, residual_fairseq.reproduce; "
            "print(all(m in sys.modules for m in ('residual_fairseq.evaluate', 'residual_fairseq.language_models', "
            "'residual_fairseq.average_checkpoints', 'residual_fairseq.passthrough')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300).stdout.strip() == "True"


# --- runs finished elsewhere (--finished-runs) -------------------------------------------------

PUBLISHED = REPO / "docs" / "figures" / "baselines" / "converged"


def _matrix_of(records, out, finished_elsewhere=None, seeds=(1, 2, 3)):
    """The matrix that covers ``records``' runs."""
    return reproduce.matrix({"sample-es-en": out / "bin"}, out, list(dict.fromkeys(r["variant"] for r in records)),
                            layers=sorted({r["layers"] for r in records}), seeds=list(seeds),
                            finished_elsewhere=finished_elsewhere)


def test_published_runs_tabulate_again_from_their_runs_json_alone(tmp_path):
    """The converged matrix is run in parts on machines that keep nothing: a part's runs.json,
    given back with --finished-runs, makes the same tables with no checkpoint and no log
    (results.md identical, every finished run's record identical, curves drawn)."""
    published = json.loads((PUBLISHED / "runs.json").read_text())
    finished = [record for record in published if record["status"].startswith("finished")]
    assert len(finished) >= 9 and any(record["status"] == "finished, did not learn" for record in finished)
    out = tmp_path / "out"
    runs = _matrix_of(published, out, run_records.read_finished_runs([PUBLISHED / "runs.json"]))
    assert sum(run_.finished for run_ in runs) == len(finished)
    paths = report.write_reports(runs, out)
    assert paths["markdown"].read_text() == (PUBLISHED / "results.md").read_text()
    assert paths["csv"].read_text() == (PUBLISHED / "results.csv").read_text()
    again = [record for record in json.loads(paths["runs_json"].read_text()) if record["status"].startswith("finished")]
    assert again == finished
    assert paths["png"].stat().st_size > 10_000
    assert not (out / "runs").exists()  # nothing was made up on disk for them


def test_curves_have_a_panel_per_depth_and_keep_the_runs_that_learned_readable(tmp_path):
    """curves.png of the published matrix: a loss panel per depth (no empty BLEU panel when no
    run validated BLEU), a legend entry per variant rather than per run, and a loss axis fitted
    to the runs that learned, naming the plateaus it leaves above it."""
    published = json.loads((PUBLISHED / "runs.json").read_text())
    runs = _matrix_of(published, tmp_path / "out", run_records.read_finished_runs([PUBLISHED / "runs.json"]))
    not_learned = report.runs_that_did_not_learn(runs)
    figure = report.curves_figure(runs, not_learned)
    panels = [axis for axis in figure.axes if axis.get_visible()]
    assert [axis.get_title() for axis in panels] == ["sample-es-en, 6 layers: valid loss",
                                                     "sample-es-en, 18 layers: valid loss"]
    six, eighteen = panels
    six_layer_runs = [run_ for run_ in runs if run_.layers == 6 and run_.curve()]
    assert len(six.get_lines()) == len(six_layer_runs) == 18
    assert [text.get_text() for text in six.get_legend().get_texts()] == [
        "post_ln", "pre_ln", "resi_dual", "deepnet", "admin", "b2t", "did not learn"]
    learned = [point["loss"] for run_ in six_layer_runs if report._key(run_) not in not_learned
               for point in run_.curve()]
    low, high = six.get_ylim()
    assert low < min(learned) and max(learned) < high < 9.0  # Post-LN's seed 3 stayed at 9.0
    assert six.get_xlabel() == "updates\nreaching above the axis:\npost_ln seeds 2, 3 (up to 9.03)"
    assert "\npost_ln seeds 1, 2, 3 (up to 9.04)\n" in eighteen.get_xlabel() + "\n"
    # Every label is drawn inside the figure (one line per variant: several on one line ran off its edge).
    renderer = figure.canvas.get_renderer()
    width = figure.bbox.width
    for axis in panels:
        extent = axis.xaxis.label.get_window_extent(renderer)
        assert 0 <= extent.x0 and extent.x1 <= width, (axis.get_title(), axis.get_xlabel())
    # No plotted point lies under a legend (Admin's 18-layer seed 2 ran under one drawn on the panel),
    # and each legend is inside the figure.
    for axis in figure.axes:
        if axis.get_legend() is None:
            continue
        box = axis.get_legend().get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 <= figure.bbox.height
        for other in panels:
            for line in other.get_lines():
                shown = other.transData.transform(line.get_xydata())
                inside = [(x, y) for x, y in shown if other.bbox.contains(x, y) and box.contains(x, y)]
                assert not inside, (axis.get_title(), other.get_title(), len(inside))

    # Validation BLEU (fairseq's --eval-bleu) gets a row of its own; nothing clipped without a failed run.
    from types import SimpleNamespace

    def fake_run(variant, seed, losses, bleus):
        points = [{"epoch": i + 1, "updates": 100 * (i + 1), "loss": loss, "bleu": bleu}
                  for i, (loss, bleu) in enumerate(zip(losses, bleus))]
        return SimpleNamespace(dataset="sample-es-en", variant=variant, layers=3, seed=seed, curve=lambda: points)

    figure = report.curves_figure([fake_run("post_ln", 1, [6, 5], [1.0, 2.0]),
                                   fake_run("resi_dual", 1, [7, 4], [1.5, 3.0])])
    panels = [axis for axis in figure.axes if axis.get_visible()]
    assert [axis.get_title() for axis in panels] == ["sample-es-en, 3 layers: valid loss",
                                                     "sample-es-en, 3 layers: valid BLEU"]
    assert panels[0].get_ylim()[0] < 4 and panels[0].get_ylim()[1] > 7 and panels[0].get_xlabel() == "updates"
    assert [len(axis.get_lines()) for axis in panels] == [2, 2]
    diverged = fake_run("b2t", 1, [6.5, float("nan"), float("inf")], [None] * 3)
    figure = report.curves_figure([fake_run("post_ln", 1, [6, 5], [None] * 2), diverged],
                                  not_learned={("sample-es-en", "post_ln", 3, 1)})
    low, high = figure.axes[0].get_ylim()
    assert low < 5 and 6.5 < high < 7 and "b2t seed 1 (up to inf)" in figure.axes[0].get_xlabel()
    # A run whose first validation is already nan is named too (max() would have returned nan).
    diverged_at_once = fake_run("b2t", 2, [float("nan"), 6.5], [None] * 2)
    figure = report.curves_figure([fake_run("post_ln", 1, [6, 5], [None] * 2), diverged, diverged_at_once],
                                  not_learned={("sample-es-en", "post_ln", 3, 1)})
    assert "b2t seeds 1, 2 (up to inf)" in figure.axes[0].get_xlabel()
    figure = report.curves_figure([fake_run("post_ln", 1, [6, 5], [None] * 2), diverged_at_once],
                                  not_learned={("sample-es-en", "post_ln", 3, 1)})
    assert "b2t seed 2 (up to nan)" in figure.axes[0].get_xlabel()


@pytest.mark.parametrize("page", ["README.md", "docs/results/converged-lr5e-3.md"])
def test_readme_summary_of_the_converged_matrix_is_the_published_results_md(page):
    """The mean ± std table in README's summary and in the results page is copied by hand at
    each publication: it must say what results.md says (a stale or mistyped number there is
    what a reader quotes)."""
    readme = markdown_rows((REPO / page).read_text(), "| variant | layers | seeds that learned |")
    published = markdown_rows((PUBLISHED / "results.md").read_text(), "| dataset | variant | layers | seeds |")
    expected = []
    for dataset, variant, layers, seeds, bleu, chrf, _tok, _vbleu, valid, _last, not_learned, _failed in published:
        learned = [] if seeds == "-" else seeds.split()
        started = len(learned) + (0 if not_learned == "-" else not_learned.count("seed "))
        if started:  # a variant and depth with no finished run yet has no row in README
            expected.append([variant, layers, f"{len(learned)} of {started}", bleu, chrf, valid])
    assert readme == expected


def test_results_page_lists_every_run_as_the_published_runs_md():
    """docs/results/converged-lr5e-3.md copies every run's numbers by hand from the driver's
    runs.md: the two must agree run for run."""
    page = markdown_rows((REPO / "docs" / "results" / "converged-lr5e-3.md").read_text(),
                          "| variant | layers | seed | epochs (ended by) |")
    published = markdown_rows((PUBLISHED / "runs.md").read_text(), "| dataset | variant | layers | seed | status |")
    # The page says "epoch cap" where the driver says "budget" (--max-epoch ended the run).
    expected = sorted([variant, layers, seed, epochs.replace("(budget)", "(epoch cap)"), *numbers]
                      for _dataset, variant, layers, seed, _status, epochs, *numbers in published)
    assert sorted([cell.replace("**", "") for cell in row[:-1]] for row in page) == expected and len(page) == 36


def test_a_run_finished_elsewhere_is_not_trained_again_and_one_finished_here_wins(tmp_path, monkeypatch, capsys):
    from residual_fairseq import train

    record = {"dataset": "sample-es-en", "variant": "b2t", "layers": 2, "seed": 1, "status": "finished",
              "epochs": 2, "ended_by": "budget", "best_valid_loss": 5.5, "best_epoch": 2, "test_bleu": 12.5,
              "test_chrf": 30.0, "test_tok_bleu": None, "checkpoint": "checkpoint_best.pt", "beam": 5,
              "sacrebleu_signature": "nrefs:1", "validations": [{"epoch": 1, "updates": 10, "loss": 6.0, "bleu": None},
                                                                {"epoch": 2, "updates": 20, "loss": 5.5, "bleu": None}]}
    elsewhere = tmp_path / "part1" / "runs.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps([record, {**record, "seed": 2, "status": "unfinished"}]))
    monkeypatch.setattr(train, "train", lambda *args, **kwargs: pytest.fail("a finished run was trained again"))
    out = tmp_path / "out"
    argv = ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants", "b2t", "--layers", "2",
            "--out", out, "--finished-runs", elsewhere]
    reproduce.main([str(arg) for arg in argv])
    printed = capsys.readouterr().out
    assert "1 runs (1 finished)" in printed and f"skip sample-es-en b2t 2L seed 1: finished ({elsewhere})" in printed
    assert "| sample-es-en | b2t | 2 | 1 | 12.50 | 30.00 |" in (out / "results.md").read_text()
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, out, ["b2t"], layers=[2],
                              finished_elsewhere=run_records.read_finished_runs([elsewhere]))
    assert run_records.run_record(run_) == record

    # Seed 2 was unfinished there: it is not carried over, so it would train here.
    assert run_records.read_finished_runs([elsewhere]).keys() == {("sample-es-en", "b2t", 2, 1)}
    # Evaluated here too: this --out's own result.json and log are the ones tabulated.
    _finished(run_, 14.0, chrf=33.0)
    assert run_.finished_where == run_.result_path and run_records.run_metrics(run_)["test_bleu"] == 14.0
    assert run_.curve() == [] and run_.ended_by() is None


def test_finished_runs_given_twice_tabulates_both_files(tmp_path, monkeypatch, capsys):
    """`--finished-runs A --finished-runs B` once kept B alone and dropped A's runs without a word."""
    from residual_fairseq import train

    record = {"dataset": "sample-es-en", "variant": "b2t", "layers": 2, "seed": 1, "status": "finished",
              "epochs": 2, "ended_by": "budget", "best_valid_loss": 5.5, "best_epoch": 2, "test_bleu": 12.5,
              "test_chrf": 30.0, "test_tok_bleu": None, "checkpoint": "checkpoint_best.pt", "beam": 5,
              "sacrebleu_signature": "nrefs:1", "validations": [{"epoch": 2, "updates": 20, "loss": 5.5, "bleu": None}]}
    parts = []
    for seed, bleu in ((1, 12.5), (2, 14.5)):
        part = tmp_path / f"part{seed}" / "runs.json"
        part.parent.mkdir()
        part.write_text(json.dumps([{**record, "seed": seed, "test_bleu": bleu}]))
        parts += ["--finished-runs", part]
    monkeypatch.setattr(train, "train", lambda *args, **kwargs: pytest.fail("a finished run was trained again"))
    out = tmp_path / "out"
    argv = ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants", "b2t", "--layers", "2",
            "--seeds", "1", "--seeds", "2", "--out", out, *parts]
    reproduce.main([str(arg) for arg in argv])
    assert "2 runs (2 finished)" in capsys.readouterr().out
    assert "| sample-es-en | b2t | 2 | 1 2 | 13.50 ± 1.41 |" in (out / "results.md").read_text()


@pytest.mark.parametrize("module, argv, dest, expected", [
    ("reproduce", ["--dataset", "sample-es-en", "--data", "a", "--out", "o", "--variants", "b2t",
                   "--variants", "admin", "--layers", "6", "--layers", "18"], "layers", [6, 18]),
    ("reproduce", ["--dataset", "sample-es-en", "--data", "a", "--out", "o", "--variants", "b2t",
                   "--variants", "admin"], "variants", ["b2t", "admin"]),
    ("analysis.cli", ["--out", "o", "--merge", "a.json", "--merge", "b.json"], "merge", ["a.json", "b.json"]),
    ("data.cli", ["--dataset", "custom", "--out", "o", "--train", "t.es", "--train", "t.en"], "train",
     [Path("t.es"), Path("t.en")]),
    ("finetune", ["--checkpoint", "c.pt", "--dataset", "custom", "-s", "es", "-t", "en", "--data-out", "d",
                  "--save-dir", "s", "--train", "t.es", "--train", "t.en"], "train", ["t.es", "t.en"]),
    ("average_checkpoints", ["--inputs", "a.pt", "--inputs", "b.pt", "--output", "c.pt"], "inputs",
     ["a.pt", "b.pt"]),
])
def test_a_list_flag_given_twice_keeps_both_lists(module, argv, dest, expected):
    parser = importlib.import_module(f"residual_fairseq.{module}").build_parser()
    assert getattr(parser.parse_args(argv), dest) == expected


def _published_record(**changes):
    record = json.loads((PUBLISHED / "runs.json").read_text())[0]
    assert record["status"] == "finished"
    record.update(changes)
    return record


@pytest.mark.parametrize("content, problem", [
    ("not json", "cannot be read as a runs.json (JSONDecodeError): give the runs.json that "
                 "residual-fairseq-reproduce wrote"),
    (b"\xff\xfe[", "cannot be read as a runs.json (UnicodeDecodeError): give the runs.json that "
                   "residual-fairseq-reproduce wrote"),
    ('{"runs": []}', "not a list of run records: give the runs.json that residual-fairseq-reproduce wrote"),
    ("[" * 5000 + "]" * 5000, "cannot be read as a runs.json (RecursionError): give the runs.json that "
                              "residual-fairseq-reproduce wrote"),
    ([_published_record(test_bleu=float("nan"))], "run 1 has no test_bleu from 0 to 100"),
    ([_published_record(test_bleu=10 ** 400)], "run 1 has no test_bleu from 0 to 100"),
    ([_published_record(test_bleu=1e200)], "run 1 has no test_bleu from 0 to 100"),
    ([_published_record(test_chrf="41")], "run 1 has no test_chrf from 0 to 100"),
    ([_published_record(test_tok_bleu=-1)], "run 1 has no test_tok_bleu from 0 to 100"),
    ([_published_record(layers="6")], "run 1 has no depth (layers) from 1 to 1000"),
    ([_published_record(layers=6.0)], "run 1 has no depth (layers) from 1 to 1000"),
    ([_published_record(seed=True)], "run 1 has no whole-number seed"),
    ([_published_record(variant="../../x")], "run 1 names no known variant"),
    ([_published_record(variant=["post_ln"])], "run 1 names no known variant"),
    ([_published_record(dataset={"a": 1})], "run 1 names no known dataset"),
    ([_published_record(dataset=None)], "run 1 names no known dataset"),
    ([_published_record(ended_by="patience 5 | injected")],
     "run 1 has an ended_by that is neither 'patience N' nor 'budget'"),
    ([_published_record(ended_by="patience \u0663")],
     "run 1 has an ended_by that is neither 'patience N' nor 'budget'"),
    ([_published_record(checkpoint="a\nb")], "run 1 has an odd checkpoint"),
    ([_published_record(checkpoint="../../etc/passwd")], "run 1 has an odd checkpoint"),
    ([_published_record(beam=0)], "run 1 has an odd beam"),
    ([_published_record(validations={})], "run 1 has no list of validations"),
    ([_published_record(validations=[{"epoch": 1, "updates": 2, "loss": "6.1", "bleu": None}])],
     "run 1 has a validation that is not {epoch, updates, loss from 0 to 100, bleu}"),
    ([_published_record(validations=[{"epoch": 1, "updates": 10 ** 400, "loss": 6.1, "bleu": None}])],
     "run 1 has a validation that is not {epoch, updates, loss from 0 to 100, bleu}"),
    ([_published_record(validations=[{"epoch": 1, "updates": 2, "loss": 1e308, "bleu": None}])],
     "run 1 has a validation that is not {epoch, updates, loss from 0 to 100, bleu}"),
    ([{"status": "unfinished"}, {"status": "finishedXYZ"}, _published_record(validations=[[1, 2]])],
     "run 3 has a validation that is not {epoch, updates, loss from 0 to 100, bleu}"),
])
def test_a_finished_runs_file_that_is_not_ours_is_one_line(tmp_path, capsys, content, problem):
    """--finished-runs puts another file's numbers into the tables: each record is checked
    against the shape the driver writes, and anything else is one line naming the file."""
    path = tmp_path / "runs.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants",
                                               "post_ln", "--layers", "6", "--out", tmp_path / "out",
                                               "--report-only", "--finished-runs", path], only_line=True)
    assert line == f"error: {path}: {problem}" + (": it is not a record residual-fairseq-reproduce wrote"
                                                  if problem.startswith("run ") else "")
    assert not (tmp_path / "out" / "results.md").exists()


def test_a_run_finished_differently_in_two_parts_is_refused(tmp_path, capsys):
    first, second, same = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    first.write_text(json.dumps([_published_record()]))
    second.write_text(json.dumps([_published_record(test_bleu=30.0)]))
    # The same run tabulated beside others may carry another status: still the same run.
    same.write_text(json.dumps([_published_record(status="finished, did not learn")]))
    assert len(run_records.read_finished_runs([first, same])) == 1
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants",
                                               "post_ln", "--layers", "6", "--out", tmp_path / "out",
                                               "--report-only", "--finished-runs", first, second], only_line=True)
    assert line == (f"error: {second}: sample-es-en post_ln 6 1 finished differently in {first}: give one of the two")
    missing = tmp_path / "nowhere.json"
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin",
                                               "--out", tmp_path / "out", "--report-only", "--finished-runs",
                                               missing], only_line=True)
    assert line == f"error: --finished-runs file {missing}: No such file or directory"


def test_a_finished_runs_file_must_be_a_regular_file(tmp_path, capsys):
    """A pipe would block the driver, a device (/dev/zero) fill its memory."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    argv = ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants", "post_ln", "--layers", "6",
            "--out", tmp_path / "out", "--report-only", "--finished-runs"]
    for path in (fifo, Path("/dev/zero"), tmp_path):
        line = user_error(capsys, reproduce.main, argv + [path], only_line=True)
        assert line == f"error: --finished-runs file {path} is not a regular file"
    # A line break in a path stays one line.
    odd = tmp_path / "no\nsuch.json"
    line = user_error(capsys, reproduce.main, argv + [odd], only_line=True)
    assert line == f"error: --finished-runs file {tmp_path}/no\\nsuch.json: No such file or directory"


def test_the_outs_own_runs_json_is_not_taken_as_finished_runs(tmp_path, capsys):
    """The tables rewrite OUT/runs.json: given as --finished-runs too, records of runs
    outside this matrix would be gone from it without a word."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(PUBLISHED / "runs.json", out / "runs.json")
    before = (out / "runs.json").read_bytes()
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin",
                                               "--variants", "post_ln", "--layers", "6", "--out", out, "--report-only",
                                               "--finished-runs", out / "." / "runs.json"], only_line=True)
    assert line == (f"error: --finished-runs {out}/runs.json is this --out's runs.json, which this command "
                    "rewrites: copy it elsewhere and give the copy")
    assert (out / "runs.json").read_bytes() == before

    # A copy is fine, and the driver says what it leaves out.
    shutil.copy(out / "runs.json", tmp_path / "part1.json")
    reproduce.main([str(arg) for arg in ["--dataset", "sample-es-en", "--data", tmp_path / "sample-es-en" / "bin", "--variants",
                                         "post_ln", "--layers", "6", "--seeds", "1", "2", "--out", out,
                                         "--report-only", "--finished-runs", tmp_path / "part1.json"]])
    printed = capsys.readouterr().out
    finished = sum(record["status"].startswith("finished") for record in json.loads(before))
    assert f"note: {finished - 2} finished runs of --finished-runs are outside this matrix" in printed
    assert [record["status"] for record in json.loads((out / "runs.json").read_text())] == [
        "finished", "finished, did not learn"]


def test_a_language_model_record_goes_round_trip(tmp_path):
    """Perplexity records carry over like BLEU ones, checkpoint name included, so chained
    parts (part 1's file and part 2's, which re-exports part 1's runs) agree."""
    record = {"dataset": "sample-lm", "variant": "resi_dual", "layers": 2, "seed": 1, "status": "finished",
              "epochs": 1, "ended_by": "budget", "best_valid_loss": 7.5, "best_epoch": 1, "test_ppl": 180.5,
              "test_loss": 7.496, "checkpoint": "checkpoint_best.pt",
              "validations": [{"epoch": 1, "updates": 8, "loss": 7.5, "bleu": None}]}
    part1 = tmp_path / "part1.json"
    part1.write_text(json.dumps([record]))
    runs = reproduce.matrix({"sample-lm": tmp_path / "sample-lm" / "bin"}, tmp_path / "out", ["resi_dual"], layers=[2],
                            finished_elsewhere=run_records.read_finished_runs([part1]))
    paths = report.write_reports(runs, tmp_path / "out")
    assert json.loads(paths["runs_json"].read_text()) == [record]
    assert "| sample-lm | resi_dual | 2 | 1 | 180.50 | 7.50 | 181.02 |" in paths["lm_markdown"].read_text()
    assert len(run_records.read_finished_runs([part1, paths["runs_json"]])) == 1
    # Language models only: results.md points at their table instead of showing an empty BLEU table.
    assert paths["markdown"].read_text() == ("No translation runs in this matrix: the language models' table "
                                             "is results-lm.md.\n")
    assert paths["csv"].read_text().startswith("dataset,variant,layers,seeds,test_bleu_mean")


def test_a_value_given_twice_is_refused_not_tabulated_twice(tmp_path, capsys):
    """Issue 38: --variants resi_dual resi_dual trained once and was tabulated as two seeds. Every
    list option refuses a repeat (and --data naming a dataset twice, where the later one won)."""
    (tmp_path / "runs.json").write_text("[]\n")
    base = ["--data", tmp_path / "sample-es-en" / "bin", "--out", tmp_path / "out"]
    cases = [
        (["--dataset", "sample-es-en", *base, "--variants", "resi_dual", "resi_dual"],
         "error: --variants resi_dual resi_dual: resi_dual is given twice; give each once"),
        (["--dataset", "sample-es-en", *base, "--layers", "2", "--layers", "02"],
         "error: --layers 2 2: 2 is given twice; give each once"),
        (["--dataset", "sample-es-en", *base, "--seeds", "1", "3", "1"],
         "error: --seeds 1 3 1: 1 is given twice; give each once"),
        (["--dataset", "sample-es-en", "sample-es-en", *base],
         "error: --dataset sample-es-en sample-es-en: sample-es-en is given twice; give each once"),
        (["--dataset", "sample-es-en", "--data", "sample-es-en=a", "sample-es-en=b", "--out", tmp_path / "out"],
         "error: --data names sample-es-en twice (a, b): give each dataset one data directory"),
        (["--dataset", "sample-es-en", *base, "--finished-runs", tmp_path / "runs.json", tmp_path / "." / "runs.json"],
         f"error: --finished-runs {tmp_path / 'runs.json'} is given twice (as {tmp_path / 'runs.json'}): "
         "give each file once"),
    ]
    for argv, expected in cases:
        assert user_error(capsys, reproduce.main, argv) == expected
    assert not (tmp_path / "out").exists()


def test_tables_and_plots_name_the_data_and_the_config_apart(tmp_path):
    """Issue 38: --dataset sample-es-en --data YOUR_CORPUS/bin titled the plots and filled the tables'
    dataset column with the config's name. The data is named (its directory, or the dataset
    prepare's manifest names), the config beside it; runs.json keeps the config as "dataset"."""
    runs = reproduce.matrix({"sample-es-en": tmp_path / "YOUR_CORPUS" / "bin"}, tmp_path / "out", ["post_ln"],
                            layers=[2], seeds=[1, 2])
    for run_, bleu in zip(runs, (10.0, 12.0)):
        _finished(run_, bleu, 40.0)
        (run_.save_dir / "train.log").write_text(
            'x | INFO | valid | {"epoch": 1, "valid_loss": "5.0", "valid_num_updates": "10"}\n')
    paths = report.write_reports(runs, tmp_path / "out")
    assert "| YOUR_CORPUS (config sample-es-en) | post_ln | 2 | 1 2 | 11.00 ± 1.41 |" in paths["markdown"].read_text()
    assert "\nYOUR_CORPUS (config sample-es-en),post_ln,2," in paths["csv"].read_text()
    assert "| YOUR_CORPUS (config sample-es-en) | post_ln | 2 | 1 | finished |" in paths["runs_markdown"].read_text()
    records = json.loads(paths["runs_json"].read_text())
    assert [(r["dataset"], r["data"]) for r in records] == [("sample-es-en", "YOUR_CORPUS")] * 2
    assert run_records.read_finished_runs([paths["runs_json"]])  # still a runs.json --finished-runs reads
    titles = [axis.get_title() for axis in report.curves_figure(runs).axes if axis.get_visible()]
    assert titles == ["YOUR_CORPUS (config sample-es-en), 2 layers: valid loss"], titles
    # The config's own data (prepare's manifest names it) keeps the plain name.
    [run_] = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", ["post_ln"],
                              layers=[2])
    assert run_records.run_label(run_) == "sample-es-en"


def test_reports_never_replace_a_file_the_run_reads(tmp_path, capsys):
    """Issue 38: what a run reads is never an output. A table, record or plot that --out would write
    over a file of the data (or of prepare's output around it) is refused before anything runs."""
    data = tmp_path / "corpus" / "bin"
    data.mkdir(parents=True)
    (data / "dict.es.txt").write_text("a 1\n")
    (tmp_path / "corpus" / "manifest.json").write_text('{"files": {"results.md": {}}}\n')  # prepare's, listing it
    (tmp_path / "corpus" / "results.md").write_text("the corpus' results.md\n")
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", data, "--out", tmp_path / "corpus",
                                               "--variants", "post_ln", "--layers", "2", "--dry-run"])
    assert line == (f"error: --out {tmp_path / 'corpus'}: its results.md would overwrite a file of the prepared data "
                    f"{tmp_path / 'corpus' / 'results.md'}: choose another --out"), line
    assert (tmp_path / "corpus" / "results.md").read_text() == "the corpus' results.md\n"
    assert not (tmp_path / "corpus" / "runs").exists()


def test_no_warmup_starts_every_run_at_the_peak_learning_rate(toy_data_bin, tmp_path, capsys):
    """Issue 37's warm-up ablation: --no-warmup is fairseq's inverse_sqrt with --warmup-init-lr at the
    peak (the config's --lr, or the one given after --): constant for the warm-up updates, then the
    same decay as with warm-up."""
    from residual_fairseq.reproduce.cli import no_warmup_flags

    assert no_warmup_flags(["sample-es-en"], []) == ["--warmup-init-lr", "0.005"]
    assert no_warmup_flags(["iwslt14-de-en"], []) == ["--warmup-init-lr", "0.0005"]
    assert no_warmup_flags(["sample-es-en", "iwslt14-de-en"], ["--lr", "1e-3"]) == ["--warmup-init-lr", "1e-3"]
    argv = ["--dataset", "sample-es-en", "--data", str(toy_data_bin), "--variants", "resi_dual", "--layers", "1",
            "--out", str(tmp_path / "out"), "--dry-run", "--no-warmup"]
    reproduce.main(argv)
    command = next(line for line in capsys.readouterr().out.splitlines() if "fairseq-train" in line)
    assert command.endswith("--warmup-updates 200 --warmup-init-lr 1e-07 --warmup-init-lr 0.005"), command


@pytest.mark.parametrize("datasets, extra, refusal", [
    (["sample-es-en"], ["--warmup-init-lr", "1e-7"], "--no-warmup sets the warm-up itself: drop --warmup-init-lr after --"),
    (["sample-es-en"], ["--lr-scheduler=cosine"], "--no-warmup sets the warm-up itself: drop --lr-scheduler after --"),
    (["wikitext-103"], [], "--no-warmup needs the inverse_sqrt learning-rate schedule; wikitext-103's config uses cosine"),
    (["sample-es-en", "iwslt14-de-en"], [], "--no-warmup: the datasets' configs peak at different learning rates "
                                             "(sample-es-en 0.005, iwslt14-de-en 0.0005): run them separately, "
                                             "or give one with -- --lr"),
])
def test_no_warmup_refuses_what_contradicts_it(datasets, extra, refusal):
    from residual_fairseq.errors import UserError
    from residual_fairseq.reproduce.cli import no_warmup_flags

    with pytest.raises(UserError) as refused:
        no_warmup_flags(datasets, extra)
    assert str(refused.value) == refusal


def test_a_run_finished_with_other_fairseq_flags_is_not_tabulated_as_this_matrix(tmp_path, capsys):
    """Issue 38 (a repeated input silently changing a result): a rerun over the same --out with other
    flags after -- (another --lr, --no-warmup) skipped the finished runs and tabulated their numbers as
    if they had been trained with the new flags."""
    data = tmp_path / "sample-es-en" / "bin"
    data.mkdir(parents=True)
    [run_] = reproduce.matrix({"sample-es-en": data}, tmp_path / "out", ["resi_dual"], layers=[1])
    _finished(run_, 12.5, 40.0)
    (run_.save_dir / "run.json").write_text(json.dumps({"name": "resi_dual-1l", "extra_args": ["--lr", "1e-3"]}))
    argv = ["--dataset", "sample-es-en", "--data", str(data), "--variants", "resi_dual", "--layers", "1",
            "--out", str(tmp_path / "out"), "--dry-run"]
    line = user_error(capsys, reproduce.main, argv + ["--", "--lr", "2e-3"])
    assert line == (f"error: sample-es-en resi_dual 1L seed 1 finished in {run_.save_dir} with other fairseq flags "
                    "(-- --lr 1e-3) than this command's (-- --lr 2e-3): its numbers would be tabulated as this "
                    "matrix's; give the same flags, or another --out"), line
    assert "with other fairseq flags (-- --lr 1e-3) than this command's (-- --warmup-init-lr 0.005)" in user_error(
        capsys, reproduce.main, argv + ["--no-warmup"])
    reproduce.main(argv + ["--", "--lr", "1e-3"])  # the same flags: the finished run is skipped and tabulated
    assert "1 runs (1 finished)" in capsys.readouterr().out
    reproduce.main(argv[:-1] + ["--report-only"])  # tabulating what is there asks no flags


@pytest.mark.parametrize("content, problem", [
    (b"{\"name\": \"\xff\"}", "cannot be read (UnicodeDecodeError): it is not a run record residual-fairseq-train wrote"),
    (b'{"extra_args": ', "cannot be read (JSONDecodeError): it is not a run record residual-fairseq-train wrote"),
    (b"[]", "is not a JSON object: it is not a run record residual-fairseq-train wrote"),
    (b'{"extra_args": "--lr 1e-3"}',
     "has an 'extra_args' that is not a list of strings: it is not a run record residual-fairseq-train wrote"),
    (b'{"extra_args": ["--lr", 0.001]}',
     "has an 'extra_args' that is not a list of strings: it is not a run record residual-fairseq-train wrote"),
])
def test_a_finished_runs_record_that_cannot_say_its_flags_is_refused_not_taken_for_this_commands(
        tmp_path, capsys, content, problem):
    """A run.json beside a finished run that is not one train writes (damaged, hand-made) cannot tell
    which flags trained the run: it was read as 'no record' and the run tabulated under this command's."""
    data = tmp_path / "sample-es-en" / "bin"
    data.mkdir(parents=True)
    [run_] = reproduce.matrix({"sample-es-en": data}, tmp_path / "out", ["resi_dual"], layers=[1])
    _finished(run_, 12.5, 40.0)
    (run_.save_dir / "run.json").write_bytes(content)
    argv = ["--dataset", "sample-es-en", "--data", str(data), "--variants", "resi_dual", "--layers", "1",
            "--out", str(tmp_path / "out"), "--dry-run", "--", "--lr", "1e-3"]
    assert user_error(capsys, reproduce.main, argv) == f"error: {run_.save_dir / 'run.json'} {problem}"
    (run_.save_dir / "run.json").write_text(json.dumps({"name": "resi_dual-1l"}))  # older than extra_args
    reproduce.main(argv)
    assert "1 runs (1 finished)" in capsys.readouterr().out
