"""residual-fairseq-reproduce --extend: runs finished here that their budget ended train on to a larger
budget; runs patience ended stay as they are; nothing else counts as an extension. On fake finished
runs (the training itself: test_lm_cli.py's end-to-end --extend test)."""
import json

import pytest
from helpers import user_error
from residual_fairseq import reproduce
from residual_fairseq.reproduce import cli

START = "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
VALID = '2026-01-01 00:00:05 | INFO | valid | {"epoch": 2, "valid_loss": "5.1", "valid_num_updates": "20"}\n'
DONE = "2026-01-01 00:00:09 | INFO | fairseq_cli.train | done training in 9.0 seconds\n"
EARLY = ("2026-01-01 00:00:08 | INFO | fairseq_cli.train | early stop since valid performance hasn't "
         "improved for last 5 runs\n")
FLAGS = ["--max-epoch", "2", "--lr", "1e-3"]


@pytest.fixture
def out(tmp_path):
    """Two finished runs trained with -- --max-epoch 2 --lr 1e-3: post_ln ended by its budget,
    resi_dual by patience."""
    data = tmp_path / "sample-es-en" / "bin"
    data.mkdir(parents=True)
    for run_, ended in zip(reproduce.matrix({"sample-es-en": data}, tmp_path / "out", ["post_ln", "resi_dual"], [1]),
                           (DONE, EARLY + DONE)):
        run_.save_dir.mkdir(parents=True)
        run_.result_path.write_text(json.dumps({"sacrebleu": {"score": 12.5}, "chrf": {"score": 40.0}}))
        (run_.save_dir / "result.hyp.txt").write_text("hypotheses\n")
        (run_.save_dir / "run.json").write_text(json.dumps({"name": run_.save_dir.parent.name, "extra_args": FLAGS}))
        (run_.save_dir / "train.log").write_text(START + VALID + ended)
        (run_.save_dir / "checkpoint_last.pt").write_bytes(b"a checkpoint")
    return data, tmp_path / "out"


def argv(data, out, *extra):
    return ["--dataset", "sample-es-en", "--data", str(data), "--variants", "post_ln", "resi_dual", "--layers", "1",
            "--out", str(out), *extra]


def save_dir(out, variant):
    return out / "runs" / "sample-es-en" / f"{variant}-1l" / "seed1"


def test_a_larger_budget_without_extend_is_refused_naming_it(out, capsys):
    data, out = out
    line = user_error(capsys, reproduce.main, argv(data, out, "--dry-run", "--", "--max-epoch", "4", "--lr", "1e-3"),
                      only_line=True)
    assert line == (f"error: sample-es-en post_ln 1L seed 1 finished in {save_dir(out, 'post_ln')} with a smaller budget "
                    "than this command's: add --extend to train it on to the larger budget, or give the same flags, "
                    "or another --out")


def test_extend_trains_on_the_runs_the_budget_ended_and_keeps_their_results(out, capsys, monkeypatch):
    """post_ln's result files move to before-extend/epoch2/ and it is handed on unfinished (to train);
    resi_dual, which patience ended, stays finished, its results in place; a dry run moves nothing."""
    data, out = out
    asked = ["--max-epoch", "4", "--lr", "1e-3"]
    reproduce.main(argv(data, out, "--extend", "--dry-run", "--", *asked))
    aside = save_dir(out, "post_ln") / "before-extend" / "epoch2"
    printed = capsys.readouterr().out
    assert (f"would extend sample-es-en post_ln 1L seed 1: move its result files to {aside}, resume from "
            "checkpoint_last.pt, evaluate again") in printed
    assert "2 runs (1 finished)" in printed and "skip sample-es-en resi_dual 1L seed 1: finished" in printed
    assert "skip sample-es-en post_ln" not in printed  # it would train on, not be skipped
    assert (save_dir(out, "post_ln") / "result.json").is_file() and not aside.exists()

    handed = {}
    monkeypatch.setattr(cli, "reproduce", lambda runs, out_, nprocs, extra, *rest, **kw: handed.update(
        {run_.variant: run_.finished for run_ in runs}, extra=extra))
    reproduce.main(argv(data, out, "--extend", "--", *asked))
    assert handed == {"post_ln": False, "resi_dual": True, "extra": asked}
    assert sorted(path.name for path in aside.iterdir()) == ["result.hyp.txt", "result.json"]
    assert json.loads((aside / "result.json").read_text())["sacrebleu"]["score"] == 12.5
    assert not list(save_dir(out, "post_ln").glob("result.*"))
    assert (save_dir(out, "resi_dual") / "result.json").is_file()
    printed = capsys.readouterr().out
    assert f"extend sample-es-en post_ln 1L seed 1: its earlier results are in {aside}" in printed
    assert "2 runs (1 finished)" in printed  # counted after the move: post_ln trains on


@pytest.mark.parametrize("asked, refusal", [
    (["--max-epoch", "4", "--lr", "2e-3"], "with other fairseq flags (-- --max-epoch 2 --lr 1e-3)"),   # not only the budget
    (["--max-epoch", "1", "--lr", "1e-3"], "with other fairseq flags (-- --max-epoch 2 --lr 1e-3)"),   # a smaller one
    (["--max-epoch", "4", "--max-update", "5", "--lr", "1e-3"], "with other fairseq flags"),  # one limit smaller (config: 0)
])
def test_only_a_larger_budget_is_an_extension(out, capsys, asked, refusal):
    data, out = out
    line = user_error(capsys, reproduce.main, argv(data, out, "--extend", "--dry-run", "--", *asked), only_line=True)
    assert refusal in line, line
    assert (save_dir(out, "post_ln") / "result.json").is_file()


def test_the_config_budget_counts_and_no_limit_is_the_largest(out, capsys, monkeypatch):
    """--max-update 0 (no limit) over the config's: a larger budget; the recorded --max-epoch given as
    --max_epoch=2 is the same flag."""
    data, out = out
    monkeypatch.setattr(cli, "reproduce", lambda *args, **kwargs: None)
    reproduce.main(argv(data, out, "--extend", "--", "--max_epoch=2", "--max-update", "0", "--lr", "1e-3",
                        "--max-epoch", "3"))
    assert (save_dir(out, "post_ln") / "before-extend" / "epoch2" / "result.json").is_file()


@pytest.mark.parametrize("damage, refusal", [
    ("checkpoint", "error: --extend: sample-es-en post_ln 1L seed 1 has no checkpoint_last.pt in {dir} to resume from"),
    ("log", "error: --extend: sample-es-en post_ln 1L seed 1's train.log does not say whether patience or its budget "
            "ended it, so whether a larger budget trains it on cannot be told"),
    ("aside", "error: --extend: {dir}/before-extend/epoch2/result.json exists already: move it away first"),
    ("update limit", "error: --extend: sample-es-en post_ln 1L seed 1 stopped at its --max-update 20, which this "
                     "command does not raise: raise --max-update too"),
])
def test_what_extend_cannot_resume_is_one_line_and_nothing_moves(out, capsys, damage, refusal):
    data, out = out
    directory = save_dir(out, "post_ln")
    asked = ["--max-epoch", "4", "--lr", "1e-3"]
    if damage == "update limit":  # it stopped at --max-update 20 (its last validation: update 20)
        (directory / "run.json").write_text(json.dumps({"name": "post_ln-1l", "extra_args": FLAGS + ["--max-update", "20"]}))
        asked += ["--max-update", "20"]
    if damage == "checkpoint":
        (directory / "checkpoint_last.pt").unlink()
    elif damage == "log":
        (directory / "train.log").write_text(START + VALID)
    else:
        (directory / "before-extend" / "epoch2").mkdir(parents=True)
        (directory / "before-extend" / "epoch2" / "result.json").write_text("an earlier extension's\n")
    line = user_error(capsys, reproduce.main, argv(data, out, "--extend", "--", *asked), only_line=True)
    assert line == refusal.format(dir=directory), line
    assert (directory / "result.json").is_file() and (directory / "result.hyp.txt").is_file()


def test_extend_with_report_only_is_refused_and_with_nothing_to_extend_says_so(out, capsys, monkeypatch):
    data, out = out
    assert user_error(capsys, reproduce.main, argv(data, out, "--extend", "--report-only"), only_line=True) == (
        "error: --extend trains runs on and --report-only trains nothing: give one of them")
    monkeypatch.setattr(cli, "reproduce", lambda *args, **kwargs: None)
    reproduce.main(argv(data, out, "--extend", "--", *FLAGS))
    assert "note: --extend: no run finished in --out with a smaller budget than this command's" in capsys.readouterr().out
    assert (save_dir(out, "post_ln") / "result.json").is_file()
