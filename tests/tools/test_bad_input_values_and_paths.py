"""The bad-input catalogue, continued (docs/reliability.md): out-of-range numbers, output paths
that cannot be written, text that is not UTF-8, things that do not fit together.

In-process and before any model is loaded or trained wherever the check allows, so
each case costs milliseconds: one line ``error: ...`` and exit 2, nothing written.
"""
import io
import json
import logging
import os
import sys

import pytest

import residual_fairseq  # noqa: F401
from helpers import user_error
from residual_fairseq import analysis, average_checkpoints, benchmark, evaluate, finetune, reproduce, train, translate

def train_args(data, save_dir, *more):
    return ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3", "--data", data,
            "--save-dir", save_dir, "--dry-run", *more]


# --- out-of-range numbers -------------------------------------------------------------------------

def test_numbers_out_of_range_fail_at_parse_time(capsys, toy_data_bin, tmp_path):
    ckpt = tmp_path / "never_read.pt"
    line = tmp_path / "in.txt"
    line.write_text("w1 w2\n")
    cases = [
        (evaluate.main, [ckpt, toy_data_bin, "--beam", "0"], "argument --beam: must be at least 1, got 0"),
        (evaluate.main, [ckpt, toy_data_bin, "--max-tokens", "-5"], "argument --max-tokens: must be at least 1"),
        (evaluate.main, [ckpt, toy_data_bin, "--lenpen", "nan"], "argument --lenpen: must be a finite number"),
        (evaluate.main, [ckpt, toy_data_bin, "--last-n", "0"], "argument --last-n: must be at least 1"),
        (translate.main, [ckpt, "--input", line, "--beam", "0"], "argument --beam: must be at least 1, got 0"),
        (translate.main, [ckpt, "--input", line, "--batch-lines", "0"], "argument --batch-lines: must be at least 1"),
        (translate.main, [ckpt, "--input", line, "--threads", "0"], "argument --threads: must be at least 1"),
        (translate.main, [ckpt, "--input", line, "--threads", "99999"], "argument --threads: must be at most 1024"),
        (translate.main, [ckpt, "--input", line, "--lenpen", "1e308"], "argument --lenpen: must be from -100 to 100"),
        (evaluate.main, [ckpt, toy_data_bin, "--lenpen=-1e9"], "argument --lenpen: must be from -100 to 100"),
        (benchmark.main, ["speed", "--data", toy_data_bin, "--threads", "10**9"], "argument --threads: expected"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--layers", "0"), "argument --layers: must be at least 1"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--layers", "1000000"), "must be at most 1000"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--nprocs", "0"), "argument --nprocs: must be at least 1"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--", "--dual-scale-encoder", "inf"),
         "--dual-scale-encoder must be a finite positive number, got inf"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--", "--dual-scale-decoder=nan"),
         "--dual-scale-decoder must be a finite positive number, got nan"),
        (train.main, train_args(toy_data_bin, tmp_path / "ck", "--", "--lr", "-1"), "--lr must be a finite positive number"),
        (reproduce.main, ["--dataset", "sample-es-en", "--data", toy_data_bin, "--out", tmp_path / "r", "--beam", "0"],
         "argument --beam: must be at least 1"),
        (analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--layers", "1000000"], "--layers must be at most 1000"),
        (analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--dual-scale", "inf"],
         "argument --dual-scale: must be a finite number, got inf"),
        (analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--embed-dim", "1000000", "--heads", "1"],
         "for its weights and optimizer state; this machine has"),
        (benchmark.main, ["speed", "--data", toy_data_bin, "--max-tokens", "0"], "argument --max-tokens: must be at least 1"),
        (benchmark.main, ["speed", "--data", toy_data_bin, "--beam", "0"], "argument --beam: must be at least 1"),
        (benchmark.main, ["speed", "--data", toy_data_bin, "--repeats", "0"], "argument --repeats: must be at least 1"),
        (benchmark.main, ["depth", "--data", toy_data_bin, "--width", "30"], "--width 30 must be divisible by the 4"),
        (benchmark.main, ["depth", "--data", toy_data_bin, "--depths", "6,5000"], "expected positive integers up to 1000"),
    ]
    for main, argv, message in cases:
        assert message in user_error(capsys, main, argv), argv
    assert not any(path.exists() for path in (tmp_path / "ck", tmp_path / "r", tmp_path / "a"))


def test_max_tokens_below_the_longest_sentence(toy_data_bin):
    from residual_fairseq.benchmark.data import draw_batches, load_task

    with pytest.raises(residual_fairseq.errors.UserError, match="--max-tokens 4 is too small for the 'train' split"):
        draw_batches(load_task(toy_data_bin), "train", 2, max_tokens=4)


def test_unbalanced_quotes_in_generate_args(capsys, toy_data_bin, tmp_path):
    line = user_error(capsys, evaluate.main, [tmp_path / "x.pt", toy_data_bin, "--generate-args", "--prefix-size '1"])
    assert "argument --generate-args: cannot split" in line and "no closing quotation" in line
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", toy_data_bin,
                                               "--out", tmp_path / "r", "--generate-args", '"--max-len-b 5'])
    assert "no closing quotation" in line


# --- output paths that cannot be written ---------------------------------------------------------------

def test_unwritable_output_paths(capsys, toy_data_bin, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    ckpt = tmp_path / "x.pt"
    cases = [
        (train.main, train_args(toy_data_bin, a_file), "--save-dir", "is a file, not a directory"),
        (train.main, train_args(toy_data_bin, a_file / "sub"), "--save-dir", "is a file, not a directory"),
        (evaluate.main, [ckpt, toy_data_bin, "--out-json", a_dir], "--out-json", "is a directory: give a file name"),
        (evaluate.main, [ckpt, toy_data_bin, "--out-json", a_file / "r.json"], "--out-json", "is a file, not a directory"),
        (evaluate.main, ["--from-generate-output", a_file, "--out-json", a_dir], "--out-json", "is a directory"),
        (average_checkpoints.main, ["--inputs", ckpt, "--output", a_dir], "--output", "is a directory"),
        (average_checkpoints.main, ["--inputs", ckpt, "--output", a_file / "avg.pt"], "--output", "is a file"),
        (analysis.main, [toy_data_bin, "--out", a_file / "analysis"], "--out", "is a file, not a directory"),
        (benchmark.main, ["speed", "--data", toy_data_bin, "--json", a_dir], "--json", "is a directory"),
        (benchmark.main, ["depth", "--data", toy_data_bin, "--markdown", a_file / "t.md"], "--markdown", "is a file"),
        (reproduce.main, ["--dataset", "sample-es-en", "--data", toy_data_bin, "--out", a_file], "--out", "is a file"),
    ]
    for main, argv, flag, message in cases:
        line = user_error(capsys, main, argv)
        assert flag in line and message in line, (argv, line)
    assert a_file.read_text() == "keep me" and not any(a_dir.iterdir())


def test_averaging_into_one_of_its_inputs_is_refused(capsys, trained_tiny, tmp_path):
    _, save_dir, _ = trained_tiny
    last = save_dir / "checkpoint_last.pt"
    before = last.read_bytes()
    line = user_error(capsys, average_checkpoints.main, ["--inputs", last, save_dir / "checkpoint_best.pt",
                                                         "--output", last])
    assert "is one of the checkpoints being averaged" in line and last.read_bytes() == before


def test_averaging_never_replaces_a_file_that_is_not_a_checkpoint(capsys, trained_tiny, tmp_path):
    """An earlier average is replaced; a file of the user's (a typo in --output) is refused."""
    _, save_dir, _ = trained_tiny
    inputs = ["--inputs", save_dir / "checkpoint_last.pt", save_dir / "checkpoint_best.pt"]
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    line = user_error(capsys, average_checkpoints.main, inputs + ["--output", notes], only_line=True)
    assert line == (f"error: --output {notes} exists and is not a checkpoint: averaging would replace it; "
                    "choose another file")
    assert notes.read_text() == "mine"
    earlier = tmp_path / "avg.pt"
    average_checkpoints.main([str(a) for a in inputs + ["--output", earlier]])
    average_checkpoints.main([str(a) for a in inputs + ["--output", earlier]])  # an earlier average: replaced
    assert earlier.read_bytes()[:4] == b"PK\x03\x04"


def test_failed_evaluate_rerun_keeps_the_earlier_result_and_its_files(trained_tiny, tmp_path, monkeypatch):
    data_bin, save_dir, _ = trained_tiny
    out = tmp_path / "eval" / "test.json"
    out.parent.mkdir()
    earlier = {out: '{"kept": true}\n', tmp_path / "eval" / "test.generate.txt": "H-0\t-1\tearlier\nT-0\tref\n",
               tmp_path / "eval" / "test.hyp.txt": "earlier\n"}
    for path, text in earlier.items():
        path.write_text(text)

    def one_sentence_only(command, output_path, threads=None, log_path=None):
        output_path.write_text("S-0\tw1\nT-0\tW1\nH-0\t-0.5\tW1\n")

    monkeypatch.setattr(evaluate.translation, "run_generate", one_sentence_only)
    with pytest.raises(residual_fairseq.errors.UserError, match="translated 1 of the 40 sentences"):
        evaluate.evaluate_run(save_dir / "checkpoint_last.pt", data_bin, out_json=out)
    assert {path: path.read_text() for path in earlier} == earlier
    assert (tmp_path / "eval" / "test.generate.failed.txt").is_file()  # the failed output, for a look
    assert not list((tmp_path / "eval").glob("*.partial-*"))


# --- text that is not UTF-8 ------------------------------------------------------------------------------

def test_translate_input_that_is_not_utf8(capsys, tmp_path, monkeypatch):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Buenos días\nAdiós, señor\n".encode("latin-1"))
    line = user_error(capsys, translate.main, [tmp_path / "x.pt", "--input", latin1])
    assert f"--input {latin1} is not UTF-8 text (line 1)" in line
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("ok\nAdiós\n".encode("cp1252"))))
    assert "standard input is not UTF-8 text (line 2)" in user_error(capsys, translate.main, [tmp_path / "x.pt"])
    wide = tmp_path / "utf16.txt"
    wide.write_bytes("Buenos días\nAdiós\n".encode("utf-16"))
    assert translate.read_input(str(wide)) == ["Buenos días", "Adiós"]


def test_evaluate_reference_that_is_not_utf8(capsys, tmp_path):
    generated = tmp_path / "gen.txt"
    generated.write_text("S-0\tx\nT-0\tyes sir\nH-0\t-0.1\tyes sir\n", encoding="utf-8")
    reference = tmp_path / "ref.txt"
    reference.write_bytes("sí señor\n".encode("latin-1"))
    line = user_error(capsys, evaluate.main, ["--from-generate-output", generated, "--reference", reference])
    assert f"{reference} is not UTF-8 text (line 1)" in line


# --- things that do not fit together ---------------------------------------------------------------------

def test_finetune_config_that_does_not_match_the_checkpoint(capsys, trained_tiny, tmp_path):
    _, save_dir, _ = trained_tiny  # resi_dual_tiny: 2+2 layers of width 64
    line = user_error(capsys, finetune.main, [
        "--checkpoint", save_dir / "checkpoint_last.pt", "--dataset", "sample-es-en", "-s", "es", "-t", "en",
        "--data-out", tmp_path / "data", "--save-dir", tmp_path / "ft", "--vocab-from", tmp_path,
        "--train-config", "sample-es-en", "resi_dual", "3"])
    assert "the training config does not match" in line and "encoder_layers 2 vs 3" in line
    assert not (tmp_path / "data").exists() and not (tmp_path / "ft").exists()


def test_reproduce_refuses_depth_flags_after_the_separator(capsys, toy_data_bin, tmp_path):
    line = user_error(capsys, reproduce.main, ["--dataset", "sample-es-en", "--data", toy_data_bin, "--out",
                                               tmp_path / "r", "--", "--encoder-layers", "6"])
    assert "give depths with --layers" in line


def test_language_pair_not_in_the_data(capsys, toy_data_bin, tmp_path):
    line = user_error(capsys, train.main, train_args(toy_data_bin, tmp_path / "ck", "-s", "de", "-t", "en"))
    assert f"-s/-t de->en: {toy_data_bin} holds src-tgt (no such pair)" in line


def test_result_json_of_a_kept_evaluation_is_never_half_written(tmp_path):
    """write_json goes through atomic_output: an existing result survives a failed write."""
    path = tmp_path / "r.json"
    path.write_text('{"kept": true}')
    with pytest.raises(TypeError):
        evaluate.write_json({"bad": object()}, path)
    assert json.loads(path.read_text()) == {"kept": True}


def test_translate_with_a_garbage_subword_model(capsys, trained_tiny, tmp_path):
    data_bin, save_dir, _ = trained_tiny
    codes = tmp_path / "codes"
    codes.write_text("not a codes file at all\n")
    model = tmp_path / "m.bin"
    model.write_bytes(b"\x00\x01garbage")
    text = tmp_path / "in.txt"
    text.write_text("w1 w2\n")
    ckpt = save_dir / "checkpoint_last.pt"
    assert "is not a subword-nmt codes file: line 1" in user_error(capsys, translate.main, [
        ckpt, "--data", data_bin, "--input", text, "--bpe", "subword_nmt", "--bpe-codes", codes])
    assert "is not a sentencepiece model" in user_error(capsys, translate.main, [
        ckpt, "--data", data_bin, "--input", text, "--bpe", "sentencepiece", "--sentencepiece-model", model])


@pytest.mark.slow
def test_no_debug_lines_or_import_noise(tmp_path):
    """fairseq's import sets the root logger to DEBUG (matplotlib then logs its font search) and,
    without tensorboardX, prints "Please install tensorboardX": neither reaches the user."""
    from helpers import CLI_ENV, REPO, run

    proc = run([sys.executable, REPO / "scripts" / "analyze.py", "--help"], env=CLI_ENV)
    output = proc.stdout + proc.stderr
    assert "DEBUG:" not in output and "tensorboardX" not in output and "usage: residual-fairseq-analyze" in output
    # The root logger is back at the level it had before the import (Python's WARNING, or
    # the user's own), not fairseq's DEBUG.
    for setup, level in (("", logging.WARNING), ("logging.getLogger().setLevel(logging.INFO); ", logging.INFO)):
        proc = run([sys.executable, "-c",
                    f"import logging; {setup}import residual_fairseq; print(logging.getLogger().level)"], env=CLI_ENV)
        assert proc.stdout.strip().splitlines()[-1] == str(level)


@pytest.mark.slow
def test_ctrl_c_while_a_command_starts_is_one_line():
    """Ctrl-C in the seconds a residual-fairseq-* command (or python scripts/X.py) spends
    importing fairseq, before its main() runs: one 'error: interrupted' line and exit 130, not a traceback through fairseq."""
    import signal
    import subprocess
    import time

    from helpers import CLI_ENV, fairseq_cli

    from pathlib import Path

    checkout_script = Path(__file__).resolve().parents[2] / "scripts" / "evaluate.py"
    for command in ([fairseq_cli("residual-fairseq-evaluate"), "--help"],
                    [sys.executable, str(checkout_script), "--help"]):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLI_ENV)
        time.sleep(0.8)  # importing fairseq takes several seconds
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (command, proc.returncode, err[-2000:])
        assert err.strip().splitlines() == ["error: interrupted"] and out == "", command


# A sitecustomize for the command under test: it tells the test when the command first
# imports fairseq (the seconds of a command's start), by a byte on an inherited pipe.
_STARTED = """
import os, sys

class _Started:
    told = False

    def find_spec(self, name, path=None, target=None):
        if name == "fairseq" and not self.told:
            self.told = True
            os.write(int(os.environ["RESIDUAL_FAIRSEQ_TEST_STARTED_FD"]), b".")
        return None

sys.meta_path.insert(0, _Started())
"""
CONSOLE_COMMANDS = ("prepare", "train", "evaluate", "average-checkpoints", "convert", "reproduce", "finetune",
                    "translate", "analyze", "benchmark")


def interrupted_after_start(command, delay, tmp_path, signum=None):
    """(exit status, stdout, stderr) of ``command`` sent SIGINT ``delay`` s after it starts
    importing fairseq. (Python's own start-up before that, site-packages' .pth files
    included, runs before any code of the package can: see docs/reliability.md.)"""
    import select
    import signal
    import subprocess
    import time

    from helpers import CLI_ENV

    (tmp_path / "sitecustomize.py").write_text(_STARTED)
    started, tell = os.pipe()
    env = {**CLI_ENV, "RESIDUAL_FAIRSEQ_TEST_STARTED_FD": str(tell),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), CLI_ENV.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, pass_fds=(tell,))
        os.close(tell)
        assert select.select([started], [], [], 120)[0], command
        assert os.read(started, 1) == b".", command
    finally:
        os.close(started)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT if signum is None else signum)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])
def test_ctrl_c_at_any_moment_of_the_start_is_one_line(delay, tmp_path):
    """Whenever Ctrl-C lands while the command starts (imports fairseq, builds its parser...):
    one 'error: interrupted' line, exit 130."""
    from helpers import fairseq_cli

    status, out, err = interrupted_after_start([fairseq_cli("residual-fairseq-translate"), "--help"], delay, tmp_path)
    assert (status, err.strip().splitlines(), out) == (130, ["error: interrupted"], ""), (delay, status, err[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0, 0.01, 0.1, 1.0])
def test_sigterm_at_any_moment_of_the_start_is_one_line(delay, tmp_path):
    """SIGTERM while the command starts (before its main can act on it): 'error: terminated', exit 143."""
    import signal

    from helpers import fairseq_cli

    status, out, err = interrupted_after_start([fairseq_cli("residual-fairseq-translate"), "--help"], delay, tmp_path,
                                               signal.SIGTERM)
    assert (status, err.strip().splitlines(), out) == (143, ["error: terminated"], ""), (delay, status, err[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("name", CONSOLE_COMMANDS + ("python -m",))
def test_ctrl_c_in_every_console_command_is_one_line(name, tmp_path):
    from helpers import fairseq_cli

    command = [sys.executable, "-m", "residual_fairseq.evaluate"] if name == "python -m" \
        else [fairseq_cli(f"residual-fairseq-{name}")]
    status, out, err = interrupted_after_start(command + ["--help"], 0.05, tmp_path)
    assert (status, err.strip().splitlines(), out) == (130, ["error: interrupted"], ""), (name, status, err[-2000:])


def test_ctrl_c_while_a_command_reports_or_exits_is_one_line(monkeypatch):
    """cli_main gives Python's KeyboardInterrupt back to the command's main only while it
    runs; before and after (reporting an error, exiting), Ctrl-C is the start-up one line."""
    import signal

    from residual_fairseq.errors import cli_main, interrupted_while_starting, quiet_interrupts, terminated_while_starting

    monkeypatch.setattr(sys, "argv", ["residual-fairseq-x"])
    seen, seen_term = [], []

    @cli_main
    def main(argv=None):
        seen.append(signal.getsignal(signal.SIGINT))
        seen_term.append(signal.getsignal(signal.SIGTERM))
        if argv:
            raise KeyboardInterrupt

    previous, previous_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        quiet_interrupts()
        assert signal.getsignal(signal.SIGTERM) is terminated_while_starting
        main([])
        assert seen == [signal.default_int_handler] and seen_term == [signal.SIG_DFL]
        assert signal.getsignal(signal.SIGINT) is interrupted_while_starting
        with pytest.raises(SystemExit) as ended:
            main(["interrupted"])
        assert ended.value.code == 130 and signal.getsignal(signal.SIGINT) is interrupted_while_starting
        # a main called in-process by another program (tests, a driver) leaves its handler alone
        signal.signal(signal.SIGINT, signal.default_int_handler)
        main([])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def test_user_errors_in_fairseq_commands_are_one_line(monkeypatch, capsys):
    """Importing the plugin into a fairseq-* console script makes a UserError that escapes
    fairseq (a refused checkpoint) one line; other errors and other programs keep Python's hook."""
    import sys

    from residual_fairseq import fairseq_patches
    from residual_fairseq.errors import UserError

    seen = []

    def python_hook(kind, error, trace):
        seen.append(kind)

    monkeypatch.setattr(sys, "excepthook", python_hook)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/python3", "script.py"])
    fairseq_patches.report_user_errors_in_fairseq_commands()
    assert sys.excepthook is python_hook  # not a fairseq command: untouched

    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-generate", "data-bin"])
    fairseq_patches.report_user_errors_in_fairseq_commands()
    fairseq_patches.report_user_errors_in_fairseq_commands()  # a second import does not stack hooks
    sys.excepthook(UserError, UserError("checkpoint x.pt is truncated"), None)
    assert capsys.readouterr().err == "error: checkpoint x.pt is truncated\n" and seen == []
    sys.excepthook(ValueError, ValueError("a bug"), None)
    assert seen == [ValueError] and capsys.readouterr().err == ""
