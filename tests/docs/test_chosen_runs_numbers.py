"""The 40-epoch chosen-rate runs' table in docs/results/fair-comparison.md is copied by hand: each row
must say what the committed records give (docs/figures/fair-comparison/chosen-6l/full-lr-RATE-VARIANT/
runs.json; Pre-LN's seed 1 is the check row's dropout-0.1 run, so its full-lr-5e-3-pre_ln holds seeds
2-3 only), at the rate best-lr chose for that row (short-6l/best-lr/selection.json), and
chosen-6l/table/ must tabulate exactly those runs. The page's seeds-2-3 table is checked the same way,
and its two tables side by side against the mean ± std of the runs that learned: the same-rate half against the
converged matrix's records (docs/figures/baselines/converged/runs.json), the own-rate half against chosen-6l/table/'s."""
import json
import re
import statistics
from pathlib import Path

from helpers import markdown_rows
from residual_fairseq.reproduce.records import read_finished_runs

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures" / "fair-comparison"
HEADER = "| variant | lr | epochs 1-10 | epochs 11-20 |"


def rate_and_variant(folder):
    """("2e-3", "b2t") of a chosen-6l/full-lr-2e-3-b2t folder."""
    return re.fullmatch(r"full-lr-([0-9]+e-[0-9]+)-([a-z0-9_]+)", folder.name).groups()


def page_rows(header):
    """The rows of the results page's table under header, bold removed (the best of a column is bold)."""
    return [[cell.replace("**", "") for cell in row]
            for row in markdown_rows((ROOT / "docs" / "results" / "fair-comparison.md").read_text(), header)]


def seed_1_runs(runs_json):
    """The finished seed-1 records of a runs.json, read as reproduce reads a --finished-runs file."""
    return [record for (_, _, _, seed), (record, _) in read_finished_runs([runs_json]).items() if seed == 1]


def finished_run(runs_json):
    runs = seed_1_runs(runs_json)
    assert len(runs) == 1, runs_json
    return runs[0]


def chosen_runs():
    """{variant: (rate, record)} of every finished chosen seed-1 run."""
    runs = {"pre_ln": ("5e-3", finished_run(FIGURES / "dropout-0.1" / "runs.json"))}
    for folder in sorted((FIGURES / "chosen-6l").glob("full-lr-*")):
        rate, variant = rate_and_variant(folder)
        if variant == "pre_ln":  # seeds 2 and 3 only: its seed 1 is the check row's run above
            assert rate == runs["pre_ln"][0] and not seed_1_runs(folder / "runs.json"), folder
            continue
        record = finished_run(folder / "runs.json")
        assert record["variant"] == variant and record["layers"] == 6, folder
        runs[variant] = (rate, record)
    return runs


def test_every_chosen_run_is_at_the_rate_best_lr_chose():
    selection = json.loads((FIGURES / "short-6l" / "best-lr" / "selection.json").read_text())
    chosen = {row["variant"]: row["chosen"] for row in selection["rows"] if row["layers"] == 6}
    runs = chosen_runs()
    assert {"pre_ln", "resi_dual", "post_ln"} <= set(runs)
    assert {variant: rate for variant, (rate, _) in runs.items()} == {variant: chosen[variant] for variant in runs}


def test_results_page_rows_are_the_records():
    runs = chosen_runs()
    rows = page_rows(HEADER)
    expected = []
    for variant, (rate, record) in runs.items():
        losses = {point["epoch"]: point["loss"] for point in record["validations"]}
        assert sorted(losses) == list(range(1, record["epochs"] + 1))
        tens = [" ".join(f"{losses[e]:.3f}" for e in range(start, min(start + 10, record["epochs"] + 1)))
                for start in (1, 11, 21, 31)]
        expected.append([variant, rate, *tens, f"{record['best_valid_loss']:.3f} (epoch {record['best_epoch']})",
                         record["ended_by"], f"{record['test_bleu']:.2f} / {record['test_chrf']:.2f}"])
    assert sorted(rows) == sorted(expected)


def test_table_tabulates_exactly_the_chosen_runs():
    runs = chosen_runs()
    table = seed_1_runs(FIGURES / "chosen-6l" / "table" / "runs.json")
    assert sorted(run["variant"] for run in table) == sorted(runs)
    for run in table:
        assert run["best_valid_loss"] == runs[run["variant"]][1]["best_valid_loss"]
        assert run["test_bleu"] == runs[run["variant"]][1]["test_bleu"]


SEEDS_HEADER = "| variant | lr | seed | best valid loss | ended by |"


def test_seeds_2_and_3_rows_are_the_records():
    """The page's seeds-2-3 table has one row per finished seed-2 or seed-3 run of the chosen folders, each as
    its record says, at the folder's (the chosen) rate."""
    expected = []
    for folder in sorted((FIGURES / "chosen-6l").glob("full-lr-*")):
        rate, variant = rate_and_variant(folder)
        for (_, _, layers, seed), (record, _) in read_finished_runs([folder / "runs.json"]).items():
            if seed == 1:
                continue
            assert record["variant"] == variant and layers == 6, folder
            losses = {point["epoch"]: point["loss"] for point in record["validations"]}
            gained = losses[record["epochs"] - 10] - losses[record["epochs"]]
            expected.append([variant, rate, str(seed), f"{record['best_valid_loss']:.3f} (epoch {record['best_epoch']})",
                             record["ended_by"], f"{gained:.3f}", f"{record['test_bleu']:.2f} / {record['test_chrf']:.2f}"])
    rows = page_rows(SEEDS_HEADER)
    assert expected and sorted(rows) == sorted(expected)


TWO_TABLES_HEADER = "| 6 layers | same rate: lr | learned | test sacreBLEU | test chrF | best valid loss | own rate: lr |"


def mean_std(values, digits):
    """A table cell: mean ± std over two seeds or more, the value itself for one, "-" for none."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def cells(records):
    """The sacreBLEU, chrF and best-valid-loss cells over records (seed order does not change them)."""
    return [mean_std([r["test_bleu"] for r in records], 2), mean_std([r["test_chrf"] for r in records], 2),
            mean_std([r["best_valid_loss"] for r in records], 3)]


def six_layer_runs(runs_json):
    """{variant: [finished 6-layer records, by seed]} of a runs.json, read as reproduce reads a --finished-runs file."""
    by_variant = {}
    for (_, variant, layers, _), (record, _) in sorted(read_finished_runs([runs_json]).items()):
        if layers == 6:
            by_variant.setdefault(variant, []).append(record)
    return by_variant


def test_two_tables_are_the_records_mean_and_std():
    """The page's side-by-side table: per variant, the same-rate half is the converged matrix's 6-layer runs (how many of
    three learned, mean ± std over those), the own-rate half chosen-6l/table/'s at the row's chosen rate (mean ± std of
    the finished seeds, every one of which learned). A seed added to the records without remaking the row fails."""
    rates = {variant: rate for variant, (rate, _) in chosen_runs().items()}
    same_rate = six_layer_runs(FIGURES.parent / "baselines" / "converged" / "runs.json")
    own_rate = six_layer_runs(FIGURES / "chosen-6l" / "table" / "runs.json")
    assert set(same_rate) == set(own_rate) == set(rates) and len(rates) == 6
    expected = []
    for variant, records in own_rate.items():
        assert all(record["status"] == "finished" for record in records), variant
        learned = [record for record in same_rate[variant] if record["status"] == "finished"]
        assert len(same_rate[variant]) == 3
        expected.append([variant, "5e-3", f"{len(learned)} of 3", *cells(learned),
                         rates[variant], " ".join(str(record["seed"]) for record in records), *cells(records)])
    assert sorted(page_rows(TWO_TABLES_HEADER)) == sorted(expected)
