"""The bad-input catalogue (docs/reliability.md): each case is one clear line and exit 2.

The CLIs run in-process (their ``main``), so a traceback would fail the test as an
exception rather than hide in a subprocess's stderr.
"""
import json
from pathlib import Path

import pytest
import torch

import residual_fairseq  # noqa: F401
from helpers import CLI_ENV, USER_DIR, fairseq_cli, run, user_error
from residual_fairseq import analysis, average_checkpoints, benchmark, evaluate, train, translate

@pytest.fixture(scope="module")
def one_line(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "one_line.txt"
    path.write_text("w1 w2 w3\n")
    return path


@pytest.fixture(scope="module")
def bad_checkpoints(trained_tiny, tmp_path_factory):
    """A truncated copy and an unregistered-architecture copy of a real checkpoint."""
    _, save_dir, _ = trained_tiny
    out = tmp_path_factory.mktemp("bad_ckpt")
    good = save_dir / "checkpoint_last.pt"
    (out / "truncated.pt").write_bytes(good.read_bytes()[:50_000])
    state = torch.load(good, weights_only=True)
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "some_other_plugins_arch"
    torch.save(state, out / "other_arch.pt")
    return {"good": good, "truncated": out / "truncated.pt", "other_arch": out / "other_arch.pt"}


@pytest.fixture(scope="module")
def other_dictionary(toy_data_bin, tmp_path_factory):
    """A data-bin whose dictionaries are larger than the model's."""
    out = tmp_path_factory.mktemp("other_dict")
    for path in toy_data_bin.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    for side in ("src", "tgt"):
        with open(out / f"dict.{side}.txt", "a") as d:
            d.writelines(f"extra{i} 1\n" for i in range(16))
    return out


def test_missing_data_dir(capsys, bad_checkpoints, one_line, tmp_path):
    missing = tmp_path / "nowhere"
    assert "data directory not found" in user_error(capsys, train.main, [
        "--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3", "--data", missing,
        "--save-dir", tmp_path / "ck"])
    assert "not found" in user_error(capsys, evaluate.main, [bad_checkpoints["good"], missing])
    assert "no dict.<lang>.txt" in user_error(capsys, translate.main, [bad_checkpoints["good"], "--data", missing, "--input", one_line])
    assert "does not exist" in user_error(capsys, analysis.main, [missing, "--out", tmp_path / "a"])
    assert "no such directory" in user_error(capsys, benchmark.main, ["speed", "--data", missing])
    assert not (tmp_path / "ck").exists() and not (tmp_path / "a").exists()


def test_dictionary_model_mismatch(capsys, bad_checkpoints, other_dictionary, one_line, tmp_path):
    assert "do not match checkpoint" in user_error(capsys, translate.main, [
        bad_checkpoints["good"], "--data", other_dictionary, "--input", one_line])
    result = tmp_path / "result.json"
    result.write_text('{"kept": true}')
    assert "size mismatch" in user_error(capsys, evaluate.main, [
        bad_checkpoints["good"], other_dictionary, "--out-json", result])
    assert json.loads(result.read_text()) == {"kept": True}  # nothing overwritten


def test_checkpoint_of_an_unregistered_architecture(capsys, bad_checkpoints, toy_data_bin, one_line, tmp_path):
    """What fairseq reports as "IndexError: Replacement index 1 out of range"."""
    for main, argv in [
        (evaluate.main, [bad_checkpoints["other_arch"], toy_data_bin]),
        (translate.main, [bad_checkpoints["other_arch"], "--data", toy_data_bin, "--input", one_line]),
        (analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--checkpoint", f"x={bad_checkpoints['other_arch']}"]),
    ]:
        assert "architecture 'some_other_plugins_arch', which is not registered" in user_error(capsys, main, argv)


def test_fairseq_without_user_dir_fails_as_documented(trained_tiny):
    """Raw fairseq without --user-dir (README, known problems): torch refuses the
    checkpoint's Namespace, and with weights-only loading lifted fairseq hides
    "unknown model" behind an IndexError. With --user-dir it works."""
    data_bin, save_dir, _ = trained_tiny
    generate = [fairseq_cli("fairseq-generate"), data_bin, "--cpu", "--path", save_dir / "checkpoint_last.pt",
                "--max-sentences", "2", "--max-tokens", "100"]
    proc = run(generate, check=False)
    assert proc.returncode != 0 and "Weights only load failed" in proc.stderr
    proc = run(generate, check=False, env={**CLI_ENV, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert proc.returncode != 0 and "IndexError: Replacement index 1 out of range" in proc.stderr
    assert run(generate + ["--user-dir", USER_DIR], check=False).returncode == 0


def test_truncated_checkpoint(capsys, bad_checkpoints, toy_data_bin, one_line, tmp_path):
    truncated = bad_checkpoints["truncated"]
    for main, argv in [
        (evaluate.main, [truncated, toy_data_bin]),
        (translate.main, [truncated, "--data", toy_data_bin, "--input", one_line]),
        (average_checkpoints.main, ["--inputs", truncated, bad_checkpoints["good"], "--output", tmp_path / "avg.pt"]),
        (analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--checkpoint", f"x={truncated}"]),
    ]:
        assert f"checkpoint {truncated} is truncated" in user_error(capsys, main, argv)
    assert not (tmp_path / "avg.pt").exists()


def test_translate_input(capsys, bad_checkpoints, toy_data_bin, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "long.txt").write_text(" ".join(["w1"] * 2000) + "\n")
    good = bad_checkpoints["good"]
    assert "empty input" in user_error(capsys, translate.main, [good, "--data", toy_data_bin, "--input", tmp_path / "empty.txt"])
    assert "line 1 is 2001 tokens long" in user_error(
        capsys, translate.main, [good, "--data", toy_data_bin, "--input", tmp_path / "long.txt"])


@pytest.mark.slow
def test_invalid_option_values(capsys, toy_data_bin, tmp_path):
    assert "argument --layers: must be at least 1, got 0" in user_error(capsys, train.main, [
        "--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "0", "--data", toy_data_bin,
        "--save-dir", tmp_path / "ck", "--dry-run"])
    assert "--layers must be at least 1" in user_error(capsys, analysis.main, [toy_data_bin, "--out", tmp_path / "a", "--layers", "0"])
    assert "must be a finite positive number, got -1" in user_error(
        capsys, analysis.main, [toy_data_bin, "--out", tmp_path / "b", "--dual-scale", "-1"])
    assert "expected positive integers" in user_error(capsys, benchmark.main, ["depth", "--data", toy_data_bin, "--depths", "0"])
    proc = run([fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, "--arch", "resi_dual_tiny",
                "--cpu", "--encoder-layers", "0"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("argument --encoder-layers: must be a finite positive number, got 0")


# --- what the system refuses: the same one line --------------------------------------------


@pytest.mark.slow
def test_a_refused_write_is_one_line_and_a_closed_pipe_ends_quietly(capsys, monkeypatch):
    import errno
    import os
    import subprocess
    import sys

    from residual_fairseq.errors import cli_main

    @cli_main
    def full_disk(argv=None):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.json")

    with pytest.raises(SystemExit) as stop:
        full_disk([])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: No space left on device: /data/out.json\n"
    # `residual-fairseq-... | head -1`: exit 141 (as a Unix tool killed by SIGPIPE), no traceback.
    script = ("import sys\nfrom residual_fairseq.errors import cli_main\n"
              "@cli_main\ndef main(argv=None):\n    for i in range(10**6):\n        print('line', i)\nmain()\n")
    proc = subprocess.run(f"{sys.executable} -c \"$SCRIPT\" | head -1", shell=True, capture_output=True,
                          text=True, env={**os.environ, "SCRIPT": script}, executable="/bin/bash", timeout=120)
    assert proc.stdout == "line 0\n" and proc.stderr == "", proc.stderr[-2000:]
    proc = subprocess.run(f"{sys.executable} -c \"$SCRIPT\" | head -1; echo \"${{PIPESTATUS[0]}}\" >&2",
                          shell=True, capture_output=True, text=True, env={**os.environ, "SCRIPT": script},
                          executable="/bin/bash", timeout=120)
    assert proc.stderr.strip() == "141"


def test_output_paths_are_checked_at_the_nearest_existing_directory(tmp_path, monkeypatch):
    import os

    from residual_fairseq import argtypes
    from residual_fairseq.argtypes import check_output_file, read_user_lines
    from residual_fairseq.errors import UserError

    locked = tmp_path / "locked"
    locked.mkdir()
    # A read-only directory (simulated: the tests may run as root, who may write anywhere).
    monkeypatch.setattr(argtypes.os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(UserError, match=f"cannot write in {locked}$"):
        check_output_file(locked / "new" / "deeper" / "out.json", "--out-json")
    assert check_output_file(tmp_path / "new" / "out.json", "--out-json") == tmp_path / "new" / "out.json"
    monkeypatch.undo()
    # inputs: a pipe (bash's <(...)) is read like a file; a device or a directory is refused
    read_end, write_end = os.pipe()
    os.write(write_end, b"first\nsecond\n")
    os.close(write_end)
    assert read_user_lines(f"/dev/fd/{read_end}") == ["first", "second"]
    for not_text in ("/dev/zero", tmp_path):
        with pytest.raises(UserError, match="is not a text file"):
            read_user_lines(not_text)
