"""The 60-epoch language-model numbers that README and docs/results/fair-comparison.md quote are
copied by hand: they must say what the committed records (docs/figures/fair-comparison/lm/runs.json)
give: mean ± std, and every pair's Welch test with reproduce's Holm correction over the 6 tests."""
import statistics
from pathlib import Path

from helpers import markdown_rows
from residual_fairseq.reproduce.records import read_finished_runs
from residual_fairseq.reproduce.report import NOISE_ALPHA, holm

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "figures" / "fair-comparison" / "lm" / "runs.json"
NAMES = {"post_ln": "Post-LN", "pre_ln": "Pre-LN", "resi_dual": "ResiDual"}


def finished_6_layer_runs():
    by_variant = {}
    for (_, variant, layers, _), (run, _) in read_finished_runs([RECORDS]).items():
        if layers == 6:
            by_variant.setdefault(variant, []).append(run)
    return {variant: sorted(runs, key=lambda run: run["seed"]) for variant, runs in by_variant.items()}


def cell(values, digits):
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def test_every_six_layer_lm_run_is_in_and_three_seeds_each():
    runs = finished_6_layer_runs()
    assert {variant: [run["seed"] for run in group] for variant, group in runs.items()} == {
        "post_ln": [1, 2, 3], "pre_ln": [1, 2, 3], "resi_dual": [1, 2, 3]}


def test_readme_60_epoch_row_is_the_records_mean_and_std():
    runs = finished_6_layer_runs()
    row = next(r for r in markdown_rows((ROOT / "README.md").read_text(), "| layers, budget | Post-LN")
               if r[0] == "6, 60 epochs")
    assert row[1:] == [cell([run["test_ppl"] for run in runs[v]], 2) for v in ("post_ln", "pre_ln", "resi_dual")]


def test_results_page_table_is_the_records_mean_and_std():
    runs = finished_6_layer_runs()
    page = (ROOT / "docs" / "results" / "fair-comparison.md").read_text()
    rows = markdown_rows(page, "| 6 layers | seeds | best valid loss (bits/token) | test perplexity | test loss (bits/token) |")
    expected = [[NAMES[v], "1 2 3", cell([r["best_valid_loss"] for r in runs[v]], 3), cell([r["test_ppl"] for r in runs[v]], 2),
                 cell([r["test_loss"] for r in runs[v]], 2)] for v in ("post_ln", "pre_ln", "resi_dual")]
    assert rows == expected


def test_results_page_pairwise_tests_are_welch_with_holm_over_six():
    from scipy.stats import ttest_ind

    runs = finished_6_layer_runs()
    metrics = {"test": lambda run: run["test_ppl"], "valid": lambda run: 2 ** run["best_valid_loss"]}
    pairs = [("pre_ln", "post_ln"), ("resi_dual", "post_ln"), ("resi_dual", "pre_ln")]
    tests = {}
    for metric, value in metrics.items():
        for a, b in pairs:
            x, y = [value(r) for r in runs[a]], [value(r) for r in runs[b]]
            tests[metric, a, b] = [statistics.mean(x) - statistics.mean(y), ttest_ind(x, y, equal_var=False).pvalue]
    for key, adjusted in zip(tests, holm([p for _, p in tests.values()])):  # one family: all 6 tests
        tests[key].append(adjusted)
    page = (ROOT / "docs" / "results" / "fair-comparison.md").read_text()
    rows = markdown_rows(page, "| pair | test perplexity: difference, p, p (Holm) |")
    expected = []
    for a, b in pairs:
        cells = [f"{tests[m, a, b][0]:+.2f}, {tests[m, a, b][1]:.3f}, {tests[m, a, b][2]:.3f}" for m in metrics]
        verdict = "beyond seed noise" if max(tests[m, a, b][2] for m in metrics) < NOISE_ALPHA else "within seed noise"
        expected.append([f"{NAMES[a]} − {NAMES[b]}", *cells, verdict])
    assert rows == expected
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"p {tests['test', 'resi_dual', 'pre_ln'][2]:.3f} against Pre-LN" in readme
