"""residual-fairseq-best-lr: each variant at its own best learning rate, chosen from reproduce
matrices run one per rate (docs/results/fair-comparison.md), on synthetic runs.json records."""
import json
from pathlib import Path

import pytest
from helpers import user_error
from residual_fairseq.reproduce import best_lr


def record(variant, seed, losses, bleu=20.0, layers=6, status="finished", ended_by="patience 5"):
    """A finished run's runs.json record (as records.run_record writes it), one validation per loss."""
    validations = [{"epoch": epoch, "updates": 100 * epoch, "loss": loss, "bleu": None}
                   for epoch, loss in enumerate(losses, 1)]
    low = min(reversed(validations), key=lambda point: point["loss"])
    return {"dataset": "sample-es-en", "variant": variant, "layers": layers, "seed": seed, "status": status,
            "epochs": len(losses), "ended_by": ended_by, "best_valid_loss": low["loss"], "best_epoch": low["epoch"],
            "test_bleu": bleu, "test_chrf": 40.0, "checkpoint": "checkpoint_best.pt", "beam": 5,
            "validations": validations}


def write_matrix(directory, records, lr=None):
    """A reproduce --out: its runs.json and, with ``lr``, each run's run.json with ``-- --lr lr``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "runs.json").write_text(json.dumps(records, indent=1) + "\n")
    for run in records if lr is not None else ():
        save_dir = directory / "runs" / run["dataset"] / f"{run['variant']}-{run['layers']}l" / f"seed{run['seed']}"
        save_dir.mkdir(parents=True, exist_ok=True)
        (save_dir / "run.json").write_text(json.dumps({"extra_args": ["--max-epoch", "40", "--lr", lr]}))
    return directory


def choose(argv):
    best_lr.main([str(word) for word in argv])


def matrix_flags(matrices):
    return [word for rate, path in matrices.items() for word in ("--matrix", f"{rate}={path}")]


def selection(out):
    return {(row["variant"], row["layers"]): row for row in json.loads((out / "selection.json").read_text())["rows"]}


def table_row(text, variant):
    return next(line for line in text.splitlines() if line.startswith(f"| sample-es-en | {variant} |"))


def test_each_row_takes_the_rate_of_its_lowest_seed_1_validation_loss_never_the_test_set(tmp_path, capsys):
    """pre_ln is best at 2e-3 by validation loss although 5e-3 has the higher test BLEU and its seed 2
    the lowest loss of all; resi_dual is best at 1e-3; a seed-1 run that did not learn is compared by its
    loss and named. --selection-seed 2 chooses by seed 2."""
    matrices = {
        "1e-3": write_matrix(tmp_path / "lr-1e-3", [record("pre_ln", 1, [6.0, 4.60]),
                                                    record("resi_dual", 1, [6.0, 4.40])]),
        "2e-3": write_matrix(tmp_path / "lr-2e-3", [record("pre_ln", 1, [6.0, 4.50, 4.55]),
                                                    record("resi_dual", 1, [6.0, 4.45])], lr="2e-3"),
        "5e-3": write_matrix(tmp_path / "lr-5e-3", [record("pre_ln", 1, [6.0, 4.52], bleu=30.0),
                                                    record("pre_ln", 2, [6.0, 4.10], bleu=30.0),
                                                    record("resi_dual", 1, [6.2, 6.1], bleu=0.1,
                                                           status="finished, did not learn")]),
    }
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best"])
    rows = selection(tmp_path / "best")
    assert rows[("pre_ln", 6)]["chosen"] == "2e-3" and rows[("pre_ln", 6)]["ranking"] == ["2e-3", "5e-3", "1e-3"]
    assert rows[("resi_dual", 6)]["chosen"] == "1e-3"
    assert rows[("pre_ln", 6)]["runs"]["2e-3"] == {"best_valid_loss": 4.50, "best_epoch": 2, "status": "finished",
                                                   "ended_by": "patience 5"}
    text = (tmp_path / "best" / "selection.md").read_text()
    assert table_row(text, "pre_ln") == "| sample-es-en | pre_ln | 6 | 4.600 (2) | 4.500 (2) | 4.520 (2) | 2e-3 |"
    assert table_row(text, "resi_dual") == ("| sample-es-en | resi_dual | 6 | 4.400 (2) | 4.450 (2) | "
                                            "6.100 (2, did not learn) | 1e-3 |")
    assert (f"- sample-es-en pre_ln 6: `residual-fairseq-reproduce --dataset sample-es-en --data DATA --variants "
            f"pre_ln --layers 6 --seeds 2 3 --out {tmp_path / 'lr-2e-3'} -- --max-epoch 40 --lr 2e-3`") in text
    assert (f"- sample-es-en resi_dual 6: `residual-fairseq-reproduce --dataset sample-es-en --data DATA --variants "
            f"resi_dual --layers 6 --seeds 2 3 --out {tmp_path / 'lr-1e-3'} -- FLAGS`") in text  # no run.json
    assert "sample-es-en pre_ln 6L: 2e-3 (2e-3 < 5e-3 < 1e-3)" in capsys.readouterr().out

    choose(matrix_flags(matrices) + ["--out", tmp_path / "by-seed-2", "--selection-seed", "2"])
    rows = selection(tmp_path / "by-seed-2")
    assert rows[("pre_ln", 6)]["chosen"] is None and rows[("pre_ln", 6)]["missing"] == ["1e-3", "2e-3"]


def test_a_row_without_every_rate_is_incomplete_and_gets_no_choice(tmp_path):
    """deepnet has no finished seed-1 run at 5e-3 (its run there is unfinished): listed as incomplete,
    naming that rate, and left out of the chosen runs' tables, even though its other rates are finished."""
    unfinished = {**record("deepnet", 1, [6.0, 3.0]), "status": "unfinished"}
    matrices = {"1e-3": write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6]), record("deepnet", 1, [4.7])]),
                "2e-3": write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.5]), record("deepnet", 1, [4.8])]),
                "5e-3": write_matrix(tmp_path / "c", [record("pre_ln", 1, [4.9]), unfinished])}
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best"])
    rows = selection(tmp_path / "best")
    assert rows[("deepnet", 6)]["chosen"] is None and rows[("deepnet", 6)]["missing"] == ["5e-3"]
    assert rows[("deepnet", 6)]["reproduce"] is None
    assert table_row((tmp_path / "best" / "selection.md").read_text(), "deepnet") == (
        "| sample-es-en | deepnet | 6 | 4.700 (1) | 4.800 (1) | - | incomplete: no finished seed-1 run with "
        "validations at 5e-3 |")
    results = (tmp_path / "best" / "results.md").read_text()
    assert "| sample-es-en | pre_ln | 6 | 2e-3 |" in results and "deepnet" not in results


def test_a_tie_goes_to_the_smaller_rate_whatever_the_order_given(tmp_path):
    matrices = {"5e-3": write_matrix(tmp_path / "c", [record("pre_ln", 1, [6.0, 4.5])]),
                "2e-3": write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.5, 4.7])]),
                "1e-2": write_matrix(tmp_path / "d", [record("pre_ln", 1, [4.6])])}
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best"])
    assert selection(tmp_path / "best")[("pre_ln", 6)]["ranking"] == ["2e-3", "5e-3", "1e-2"]


def test_check_epochs_says_whether_the_first_epochs_rank_the_rates_as_the_full_runs(tmp_path, capsys):
    """With --check-epochs 3: pre_ln's first 3 epochs rank the rates as its full runs (agrees);
    resi_dual's 2e-3 leads after 3 epochs, 1e-3 in the end (disagrees); b2t's choice holds but the
    others swap (same choice, other order); post_ln's 5e-3 run was cut by its budget after 2
    validations (cannot tell); admin's 5e-3 run ended by patience after 2 (its first 3 epochs are
    the whole run: agrees); deepnet's 1e-3 and 5e-3 runs are shortened selection runs the budget
    ended after 3 epochs, its chosen 2e-3 run trained on: the check would repeat the selection (cannot tell)."""
    losses = {  # variant: {rate: validation losses}
        "pre_ln": {"1e-3": [6.0, 5.5, 5.0, 4.5], "2e-3": [5.8, 5.2, 4.8, 4.4], "5e-3": [6.5, 6.0, 5.5, 5.0]},
        "resi_dual": {"1e-3": [6.0, 5.5, 5.0, 4.3], "2e-3": [5.8, 5.2, 4.8, 4.4], "5e-3": [6.5, 6.0, 5.5, 5.0]},
        "b2t": {"1e-3": [5.0, 4.9, 4.8, 4.2], "2e-3": [6.0, 5.9, 5.5, 4.5], "5e-3": [6.0, 5.8, 5.2, 4.6]},
        "post_ln": {"1e-3": [6.0, 5.5, 5.0, 4.5], "2e-3": [5.8, 5.2, 4.8, 4.4], "5e-3": [5.0, 4.9]},
        "admin": {"1e-3": [6.0, 5.5, 5.0, 4.5], "2e-3": [5.8, 5.2, 4.8, 4.4], "5e-3": [8.0, 8.1]},
        "deepnet": {"1e-3": [6.0, 5.5, 5.0], "2e-3": [5.8, 5.2, 4.8, 4.4], "5e-3": [6.5, 6.0, 5.5]},
    }
    budget = {("post_ln", "5e-3"), ("deepnet", "1e-3"), ("deepnet", "5e-3")}
    matrices = {rate: write_matrix(tmp_path / f"lr-{rate}", [
        record(variant, 1, by_rate[rate], ended_by="budget" if (variant, rate) in budget else "patience 5")
        for variant, by_rate in losses.items()])
                for rate in ("1e-3", "2e-3", "5e-3")}
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best", "--check-epochs", "3"])
    rows = selection(tmp_path / "best")
    assert rows[("pre_ln", 6)]["check"] == {"verdict": "agrees", "ranking": ["2e-3", "1e-3", "5e-3"]}
    assert rows[("resi_dual", 6)]["chosen"] == "1e-3"
    assert rows[("resi_dual", 6)]["check"] == {"verdict": "disagrees", "ranking": ["2e-3", "1e-3", "5e-3"]}
    assert rows[("b2t", 6)]["check"] == {"verdict": "same choice, other order", "ranking": ["1e-3", "5e-3", "2e-3"]}
    assert rows[("post_ln", 6)]["chosen"] == "2e-3"  # the full runs choose without the check
    assert rows[("post_ln", 6)]["check"]["verdict"] == "cannot tell"
    assert rows[("admin", 6)]["check"] == {"verdict": "agrees", "ranking": ["2e-3", "1e-3", "5e-3"]}
    assert rows[("deepnet", 6)]["chosen"] == "2e-3"
    assert rows[("deepnet", 6)]["check"] == {"verdict": "cannot tell", "why": "1e-3 has no validation after epoch 3"}
    text = (tmp_path / "best" / "selection.md").read_text()
    assert table_row(text, "resi_dual").endswith("| 1e-3 | disagrees (2e-3 < 1e-3 < 5e-3) |")
    assert table_row(text, "post_ln").endswith("| 4.900 (2, budget) | 2e-3 (budget-limited: 5e-3 ended by the budget) "
                                               "| cannot tell (5e-3 has 2 validations in epochs 1-3) |")
    assert "sample-es-en pre_ln 6L: 2e-3 (2e-3 < 1e-3 < 5e-3); first 3 epochs: agrees" in capsys.readouterr().out


def test_a_choice_over_a_run_the_budget_ended_is_named_budget_limited(tmp_path, capsys):
    """pre_ln's 1e-3 run, beaten by 2e-3, was ended by the epoch budget while still improving: a longer
    budget could change the choice, so it is budget-limited. resi_dual's chosen run is the one the budget
    ended (more epochs only lower its loss) and the others ended by patience: not budget-limited."""
    ended = {("pre_ln", "1e-3"): "budget", ("resi_dual", "2e-3"): "budget"}
    losses = {"pre_ln": {"1e-3": [6.0, 5.0, 4.7], "2e-3": [5.5, 4.5, 4.6]},
              "resi_dual": {"1e-3": [6.0, 5.0, 5.1], "2e-3": [5.5, 4.8, 4.4]}}
    matrices = {rate: write_matrix(tmp_path / f"lr-{rate}", [
        record(variant, 1, by_rate[rate], ended_by=ended.get((variant, rate), "patience 5"))
        for variant, by_rate in losses.items()]) for rate in ("1e-3", "2e-3")}
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best"])
    rows = selection(tmp_path / "best")
    assert (rows[("pre_ln", 6)]["chosen"], rows[("pre_ln", 6)]["budget_limited"]) == ("2e-3", ["1e-3"])
    assert (rows[("resi_dual", 6)]["chosen"], rows[("resi_dual", 6)]["budget_limited"]) == ("2e-3", [])
    text = (tmp_path / "best" / "selection.md").read_text()
    assert table_row(text, "pre_ln").endswith(
        "| 4.700 (3, budget) | 4.500 (2) | 2e-3 (budget-limited: 1e-3 ended by the budget) |")
    assert table_row(text, "resi_dual").endswith("| 5.000 (2) | 4.400 (3, budget) | 2e-3 |")
    out = capsys.readouterr().out
    assert "pre_ln 6L: 2e-3 (2e-3 < 1e-3) (budget-limited: 1e-3 ended by the budget)" in out
    assert "resi_dual 6L: 2e-3 (2e-3 < 1e-3)\n" in out


def test_a_matrix_whose_runs_trained_at_another_rate_is_refused(tmp_path, capsys):
    """A run.json in the matrix's run directories recording --lr 0.002 under --matrix 1e-3 is refused,
    naming the run; 0.001 (the same number spelled otherwise) is not."""
    write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])], lr="0.002")
    write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.5])], lr="2e-3")
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={tmp_path / 'a'}", "--matrix", f"2e-3={tmp_path / 'b'}",
                                             "--out", tmp_path / "best"], only_line=True)
    save_dir = tmp_path / "a" / "runs" / "sample-es-en" / "pre_ln-6l" / "seed1"
    assert line == (f"error: --matrix 1e-3={tmp_path / 'a' / 'runs.json'}: sample-es-en pre_ln 6L seed 1 was trained "
                    f"with --lr 0.002 ({save_dir / 'run.json'}), not 1e-3: give each matrix its rate")
    assert not (tmp_path / "best").exists()
    write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])], lr="0.001")
    choose(["--matrix", f"1e-3={tmp_path / 'a'}", "--matrix", f"2e-3={tmp_path / 'b'}", "--out", tmp_path / "best"])
    assert selection(tmp_path / "best")[("pre_ln", 6)]["chosen"] == "2e-3"


@pytest.mark.parametrize("second, refusal", [
    ("0.001={b}", "error: --matrix 0.001 and --matrix 1e-3 are the same learning rate: give each once"),
    ("2e-3={a}/runs.json", "error: --matrix 2e-3={a}/runs.json is the runs.json of --matrix 1e-3 too: "
                           "give each matrix once"),
    ("2e-3={tmp}/none", "error: --matrix 2e-3={tmp}/none: no such file or directory"),
    ("2e-3={tmp}", "error: --matrix 2e-3={tmp} holds no runs.json: give a residual-fairseq-reproduce --out that has "
                   "tabulated its runs, or a runs.json"),
    ("2e-3={tmp}/bad.json", "error: {tmp}/bad.json: run 1 has no test_bleu from 0 to 100: it is not a record "
                            "residual-fairseq-reproduce wrote"),
    ("0={b}", "error: --matrix 0={b}: the learning rate must be a finite number above 0, not '0'"),
    ("nan={b}", "error: --matrix nan={b}: the learning rate must be a finite number above 0, not 'nan'"),
    ("inf={b}", "error: --matrix inf={b}: the learning rate must be a finite number above 0, not 'inf'"),
    ("{b}", "error: --matrix {b}: give LR=PATH (a learning rate, a reproduce --out or its runs.json)"),
])
def test_a_matrix_given_twice_missing_or_not_ours_is_refused(tmp_path, capsys, second, refusal):
    a = write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])])
    b = write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.5])])
    (tmp_path / "bad.json").write_text(json.dumps([{**record("pre_ln", 1, [4.5]), "test_bleu": "20"}]))
    fill = {"a": a, "b": b, "tmp": tmp_path}
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={a}", "--matrix", second.format(**fill),
                                             "--out", tmp_path / "best"], only_line=True)
    assert line == refusal.format(**fill), line
    assert not (tmp_path / "best").exists()


def test_fewer_than_two_matrices_is_refused(tmp_path, capsys):
    a = write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])])
    assert user_error(capsys, best_lr.main, ["--matrix", f"1e-3={a}", "--out", tmp_path / "best"], only_line=True) == (
        "error: give --matrix LR=PATH for at least 2 learning rates: one rate has nothing to choose from")


@pytest.mark.parametrize("out", ["{a}", "{a}/.", "{c}", "{d}", "{e}"])
def test_an_out_where_the_tables_would_replace_a_matrixs_runs_json_is_refused(tmp_path, capsys, out):
    """--out a matrix directory (given as the directory, or as its runs.json under another name), or
    where runs.json would replace a matrix's file through a link: the tables would be written over
    what the command reads. Nothing is written."""
    a = write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])], lr="1e-3")
    c = write_matrix(tmp_path / "c", [record("pre_ln", 1, [4.5])])
    d = write_matrix(tmp_path / "d", [record("pre_ln", 1, [4.4])])
    (d / "runs.json").rename(d / "part.json")
    e = write_matrix(tmp_path / "e", [record("pre_ln", 1, [4.3])])
    (tmp_path / "link.json").symlink_to(e / "runs.json")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    out = Path(out.format(a=a, c=c, d=d, e=e))
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={a}", "--matrix", f"2e-3={c / 'runs.json'}",
                                             "--matrix", f"3e-3={d / 'part.json'}", "--matrix",
                                             f"4e-3={tmp_path / 'link.json'}", "--out", out], only_line=True)
    assert line.startswith(f"error: --out {out} is where --matrix ") and line.endswith(
        "'s runs.json is, which the tables written there would replace: choose another --out")
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_results_show_the_chosen_rate_per_row_and_average_only_its_seeds(tmp_path):
    """pre_ln is chosen at 2e-3: its row of results.md names 2e-3 and is mean ± std over 2e-3's seeds
    1-3 (BLEU 20, 21, 22) only, not 1e-3's seeds 2 and 3 (BLEU 10 and 40). resi_dual is chosen at 1e-3."""
    first = [record("pre_ln", 1, [4.6], bleu=19.0), record("pre_ln", 2, [4.6], bleu=10.0),
             record("pre_ln", 3, [4.6], bleu=40.0), record("resi_dual", 1, [4.3], bleu=25.0),
             record("resi_dual", 2, [4.3], bleu=27.0)]
    second = [record("pre_ln", seed, [4.5 + seed / 100], bleu=19.0 + seed) for seed in (1, 2, 3)]
    second.append(record("resi_dual", 1, [4.4], bleu=5.0))
    matrices = {"1e-3": write_matrix(tmp_path / "a", first), "2e-3": write_matrix(tmp_path / "b", second)}
    choose(matrix_flags(matrices) + ["--out", tmp_path / "best"])
    results = (tmp_path / "best" / "results.md").read_text()
    assert results.splitlines()[0].startswith("| dataset | variant | layers | learning rate | seeds | test sacreBLEU |")
    assert table_row(results, "pre_ln").startswith("| sample-es-en | pre_ln | 6 | 2e-3 | 1 2 3 | 21.00 ± 1.00 | ")
    assert table_row(results, "resi_dual").startswith("| sample-es-en | resi_dual | 6 | 1e-3 | 1 2 | 26.00 ± 1.41 | ")
    csv = (tmp_path / "best" / "results.csv").read_text().splitlines()
    assert csv[0].startswith("dataset,variant,layers,learning_rate,seeds,") and csv[1].startswith(
        "sample-es-en,pre_ln,6,2e-3,1 2 3,21.0,1.0,")
    runs = json.loads((tmp_path / "best" / "runs.json").read_text())
    assert [(run["variant"], run["seed"], run["test_bleu"]) for run in runs] == [
        ("pre_ln", 1, 20.0), ("pre_ln", 2, 21.0), ("pre_ln", 3, 22.0), ("resi_dual", 1, 25.0), ("resi_dual", 2, 27.0)]


def test_an_out_holding_a_matrixs_runs_is_refused(tmp_path, capsys):
    """The chosen runs are tabulated from their records; a result.json under --out/runs/ would be
    read before them."""
    a = write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])])
    b = write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.5])])
    (tmp_path / "best" / "runs").mkdir(parents=True)
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={a}", "--matrix", f"2e-3={b}",
                                             "--out", tmp_path / "best"], only_line=True)
    assert line == f"error: --out {tmp_path / 'best'} holds a reproduce matrix's runs/: choose another --out"
    assert [path.name for path in (tmp_path / "best").iterdir()] == ["runs"]


def test_matrices_of_different_data_are_refused(tmp_path, capsys):
    """The same config trained on two corpora (runs.json names each run's data): their losses say
    nothing about the rate, so choosing between them is refused."""
    theirs = dict(record("pre_ln", 1, [4.4]), data="my-corpus")
    write_matrix(tmp_path / "a", [record("pre_ln", 1, [4.6])])
    write_matrix(tmp_path / "b", [theirs])
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={tmp_path / 'a'}", "--matrix", f"2e-3={tmp_path / 'b'}",
                                             "--out", str(tmp_path / "best")])
    assert "pre_ln 6L was trained on different data in the matrices" in line and "my-corpus" in line
    assert not (tmp_path / "best").exists()
    # A record naming the config's own data, beside an older one that names none: the same data.
    write_matrix(tmp_path / "b", [dict(record("pre_ln", 1, [4.4]), data="sample-es-en")])
    best_lr.main(["--matrix", f"1e-3={tmp_path / 'a'}", "--matrix", f"2e-3={tmp_path / 'b'}", "--out", str(tmp_path / "best")])
    assert "| sample-es-en | pre_ln | 6 | 4.600 (1) | 4.400 (1) | 2e-3 |" in (tmp_path / "best" / "selection.md").read_text()


def test_runs_finished_in_a_matrix_but_missing_from_its_runs_json_are_named(tmp_path, capsys):
    """A reproduce command over a part of a matrix (one row's other seeds) rewrites runs.json with that
    part only: the runs finished in the directory that it lacks are named with the command that
    tabulates the whole, and left out (the row is incomplete, not chosen from a stale record)."""
    part = write_matrix(tmp_path / "lr-2e-3", [record("pre_ln", 2, [5.0, 4.6])])
    for name, seed in (("pre_ln-6l", 1), ("pre_ln-6l", 2), ("b2t-6l", 1), ("not-a-run", 1), ("pre_ln-6l", "x"),
                       ("pre_ln-6l", "\u00b2"), ("pre_ln-\u00b2l", 1)):  # "²": str.isdigit, not int()
        (part / "runs" / "sample-es-en" / name / f"seed{seed}").mkdir(parents=True)
        (part / "runs" / "sample-es-en" / name / f"seed{seed}" / "result.json").write_text("{}")
    whole = write_matrix(tmp_path / "lr-1e-3", [record("pre_ln", 1, [5.0, 4.5])])
    choose(matrix_flags({"1e-3": whole, "2e-3": part}) + ["--out", tmp_path / "best"])
    out = capsys.readouterr().out
    assert (f"note: --matrix 2e-3: 2 runs finished in {part} are not in its runs.json (e.g. sample-es-en b2t 6 1), "
            "left out here: a reproduce command writes the runs of its own matrix only; rewrite it over the whole "
            f"matrix with residual-fairseq-reproduce ... --seeds ... --out {part} --report-only") in out
    assert "--matrix 1e-3" not in out
    assert selection(tmp_path / "best")[("pre_ln", 6)]["missing"] == ["2e-3"]


def test_a_run_record_that_cannot_say_its_rate_is_refused_not_skipped(tmp_path, capsys):
    """A matrix's run.json that is not one train writes cannot say which --lr trained the run: refused
    with one line naming it (it was read as 'no record', and the mislabelled-matrix check skipped)."""
    a = write_matrix(tmp_path / "a", [record("pre_ln", 1, [5.0])], lr="1e-3")
    b = write_matrix(tmp_path / "b", [record("pre_ln", 1, [4.0])], lr="2e-3")
    damaged = b / "runs" / "sample-es-en" / "pre_ln-6l" / "seed1" / "run.json"
    damaged.write_text('{"extra_args": "--lr 1e-3"}')
    line = user_error(capsys, best_lr.main, ["--matrix", f"1e-3={a}", "--matrix", f"2e-3={b}", "--out", tmp_path / "best"])
    assert line == (f"error: {damaged} has an 'extra_args' that is not a list of strings: it is not a run record "
                    "residual-fairseq-train wrote"), line
    assert not (tmp_path / "best").exists()
