"""The tables and curves of a reproduce matrix, from what its runs left on disk.

:func:`write_reports` writes::

    OUT/results.md  OUT/results.csv    mean ± std over seeds per dataset, variant, depth; seeds
                                       that did not learn or failed are named apart (the markdown
                                       adds which differences are beyond seed noise, Holm-corrected,
                                       and where validation loss and BLEU rank variants differently)
    OUT/runs.md     OUT/runs.json      every run as it stands, seed by seed (records.run_record)
    OUT/curves.png                     validation loss and BLEU against updates

A run is a :class:`residual_fairseq.reproduce.runs.Run`, read here through its attributes
(dataset, variant, layers, seed, finished, failure, result(), curve(), ended_by()) only:
this module does not import the runs module, which imports it.
"""
import csv
import io
import json
import math
import warnings
from pathlib import Path
from typing import List, Optional

from ..argtypes import is_finite_number
from ..atomic import atomic_output, write_text_atomically
from ..variants import COLOURS
from .records import (LM_METRICS, METRICS, data_label, is_language_model, metrics_for, run_label, run_metrics,
                      run_record)


def runs_markdown(records: List[dict]) -> str:
    """A row per run: status, epochs, best validation, test numbers (the columns its runs have)."""
    tests = [(column, label) for column, label in METRICS + LM_METRICS
             if column.startswith("test_") and any(column in record for record in records)]
    header = ["dataset", "variant", "layers", "seed", "status", "epochs (ended by)", "best valid loss (epoch)"]
    lines = ["| " + " | ".join(header + [label for _, label in tests]) + " |", "|" + "---|" * (len(header) + len(tests))]
    for record in records:
        epochs = "-" if record["epochs"] is None else f"{record['epochs']} ({record['ended_by'] or '-'})"
        best = "-" if record["best_valid_loss"] is None else f"{record['best_valid_loss']:.3f} ({record['best_epoch']})"
        cells = [data_label(record["dataset"], record.get("data")), record["variant"], str(record["layers"]), str(record["seed"]), record["status"],
                 epochs, best] + ["-" if record.get(column) is None else f"{record[column]:.2f}" for column, _ in tests]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# A finished translation run scoring below this test sacreBLEU, where another run of the
# same dataset and depth scored at least this much, did not learn to translate. At lr 5e-3
# Post-LN and DeepNet runs became target-side language models (the source is worth 0 bits
# to them, docs/baselines.md) and scored 0.09 while the others scored 17-20. Such runs are
# named in the "did not learn" column and left out of mean ± std and of the seed-noise
# tests: a mean over them would mix "does it train at this setting" with "how well does it
# translate". When no run of a dataset and depth reaches it (a short budget: the quick
# end-to-end check), none is set apart.
DID_NOT_LEARN_BELOW_BLEU = 1.0


def _key(run: "Run"):
    return run.dataset, run.variant, run.layers, run.seed


def runs_that_did_not_learn(runs: List["Run"]) -> set:
    """The finished runs (as ``(dataset, variant, layers, seed)``) that did not learn, by the rule above."""
    bleu = {}
    for run in runs:
        if run.finished:
            score = run_metrics(run).get("test_bleu")
            if score is not None:
                bleu[_key(run)] = score
    learning_groups = {(dataset, layers) for (dataset, _, layers, _), score in bleu.items()
                       if score >= DID_NOT_LEARN_BELOW_BLEU}
    return {key for key, score in bleu.items()
            if score < DID_NOT_LEARN_BELOW_BLEU and (key[0], key[2]) in learning_groups}


def mean_std(values):
    """Mean and sample standard deviation (None when there are fewer than 2 values)."""
    values = [value for value in values if value is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


def summarize(runs: List["Run"], not_learned: Optional[set] = None, extra_column=None) -> List[dict]:
    """One row per (dataset, variant, layers): mean ± std over the finished seeds that learned;
    seeds that did not learn (:func:`runs_that_did_not_learn`) are named in ``did_not_learn``,
    failed ones in ``failed``. ``not_learned``: that set, when the caller has it already.
    ``extra_column``: ``(label, {(dataset, variant, layers): text})``, a column of the caller's
    for each row under ``label`` ("-" where it has no text; residual-fairseq-best-lr: the rate)."""
    groups = {}
    not_learned = runs_that_did_not_learn(runs) if not_learned is None else not_learned
    for run in runs:
        if run.finished or run.failure:
            groups.setdefault((run.dataset, run.variant, run.layers), []).append(run)
    rows = []
    for (dataset, variant, layers), members in groups.items():
        finished = [(run, run_metrics(run)) for run in members if run.finished]
        learned = [(run, metrics) for run, metrics in finished if _key(run) not in not_learned]
        metrics = [metrics for _, metrics in learned]
        row = {"dataset": dataset, "data": run_label(members[0]), "variant": variant, "layers": layers,
               "seeds": " ".join(str(run.seed) for run, _ in learned),
               "did_not_learn": "; ".join(f"seed {run.seed} ({metrics['test_bleu']:.2f} BLEU)"
                                          for run, metrics in finished if _key(run) in not_learned),
               "failed": "; ".join(f"seed {run.seed}: {run.failure}" for run in members if not run.finished)}
        if extra_column is not None:
            row[extra_column[0]] = extra_column[1].get((dataset, variant, layers)) or "-"
        for column, _ in metrics_for(dataset):
            row[f"{column}_mean"], row[f"{column}_std"] = mean_std([m[column] for m in metrics])
        rows.append(row)
    return rows


# The metrics compared across variants for seed noise, and which way is better. The best
# validation loss is the number the learning rate and checkpoint are chosen by; the test
# numbers are what the tables report.
NOISE_METRICS = {"test_bleu": ("test sacreBLEU", max), "test_chrf": ("test chrF", max),
                 "best_valid_loss": ("best valid loss", min),
                 "test_ppl": ("test perplexity", min), "best_valid_ppl": ("best valid perplexity", min)}
NOISE_ALPHA = 0.05


def holm(p_values: List[float]) -> List[float]:
    """Holm's step-down adjustment of ``p_values`` (one family of tests): the i-th smallest p
    times the number of tests not yet rejected, made monotone, capped at 1. A difference
    survives the correction when its adjusted p is below alpha. nan (a test that could not be
    made) stays nan and does not count as a test."""
    order = sorted((p, index) for index, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p_value, index) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_value))
        adjusted[index] = running
    return adjusted


def seed_noise(runs: List["Run"], alpha: float = NOISE_ALPHA, not_learned: Optional[set] = None) -> List[dict]:
    """Per dataset, depth and metric: each variant against the best one, by Welch's t-test over
    their seeds (two-sided; seeds that did not learn are left out, and so are variants with
    fewer than 2 finished seeds that learned).

    The tests of one table (translation or language models: write_reports' two tables) are
    one family, corrected by :func:`holm`: a difference is "beyond seed noise" when its
    Holm-adjusted p is below ``alpha``; "uncorrected p < alpha only" when only its own p is.
    """
    values = {}  # (dataset, layers, metric) -> {variant: [one value per seed]}
    labels = {run.dataset: run_label(run) for run in runs}
    not_learned = runs_that_did_not_learn(runs) if not_learned is None else not_learned
    for run in runs:
        metrics = run_metrics(run) if run.finished and _key(run) not in not_learned else None
        if metrics is not None:
            for metric in NOISE_METRICS:
                if metrics.get(metric) is not None:
                    values.setdefault((run.dataset, run.layers, metric), {}).setdefault(run.variant, []).append(
                        metrics[metric])
    rows = []
    for (dataset, layers, metric), by_variant in values.items():
        label, better = NOISE_METRICS[metric]
        seeded = {variant: seeds for variant, seeds in by_variant.items() if len(seeds) >= 2}
        if len(seeded) < 2:
            continue
        from scipy.stats import ttest_ind

        best = better(seeded, key=lambda variant: mean_std(seeded[variant])[0])
        for variant, seeds in seeded.items():
            if variant == best:
                continue
            with warnings.catch_warnings():  # (nearly) identical seeds: scipy warns, and p is nan or 1
                warnings.simplefilter("ignore", RuntimeWarning)
                p_value = float(ttest_ind(seeded[best], seeds, equal_var=False).pvalue)
            rows.append({"dataset": dataset, "data": labels[dataset], "layers": layers, "metric": label, "best": best, "variant": variant,
                         "difference": mean_std(seeds)[0] - mean_std(seeded[best])[0], "p": p_value})
    for family in (True, False):  # language models, translation: a table each
        members = [row for row in rows if is_language_model(row["dataset"]) == family]
        for row, adjusted in zip(members, holm([row["p"] for row in members])):
            row["p_holm"] = adjusted
            row["verdict"] = ("no spread to test" if math.isnan(row["p"])
                              else "beyond seed noise" if adjusted < alpha
                              else f"uncorrected p < {alpha:g} only" if row["p"] < alpha
                              else "within seed noise")
    return rows


def seed_noise_markdown(rows: List[dict]) -> str:
    if not rows:
        return ""
    tests = sum(not math.isnan(row["p"]) for row in rows)
    lines = [f"\nEach variant against the best, Welch's t-test over the seeds (two-sided; seeds that did not "
             f"learn and variants with one finished seed are left out). Holm's correction over the {tests} "
             f"tests of this table: a difference is beyond seed noise when its corrected p is below "
             f"{NOISE_ALPHA:g}.\n",
             "| dataset | layers | metric | best | variant | difference | p | p (Holm) | verdict |", "|" + "---|" * 9]
    for row in rows:
        p_value, p_holm = ("-" if math.isnan(row[key]) else f"{row[key]:.3f}" for key in ("p", "p_holm"))
        lines.append(f"| {row.get('data', row['dataset'])} | {row['layers']} | {row['metric']} | {row['best']} | {row['variant']} | "
                     f"{row['difference']:+.{3 if 'loss' in row['metric'] else 2}f} | {p_value} | {p_holm} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def rank_disagreements(rows: List[dict]) -> List[dict]:
    """Per dataset and depth of :func:`summarize`'s rows: every pair of variants that the mean
    best validation loss ranks one way and the mean test sacreBLEU the other (the checkpoint
    and the learning rate are chosen by the first, the tables report the second)."""
    found = []
    groups = {}
    for row in rows:
        if row.get("best_valid_loss_mean") is not None and row.get("test_bleu_mean") is not None:
            groups.setdefault((row.get("data", row["dataset"]), row["layers"]), []).append(row)
    for (data, layers), members in groups.items():
        for number, first in enumerate(members):
            for second in members[number + 1:]:
                lower_loss, higher_loss = sorted((first, second), key=lambda row: row["best_valid_loss_mean"])
                if (lower_loss["best_valid_loss_mean"] < higher_loss["best_valid_loss_mean"]
                        and lower_loss["test_bleu_mean"] < higher_loss["test_bleu_mean"]):
                    found.append({"data": data, "layers": layers, "lower_loss": lower_loss["variant"],
                                  "higher_bleu": higher_loss["variant"],
                                  "losses": (lower_loss["best_valid_loss_mean"], higher_loss["best_valid_loss_mean"]),
                                  "bleus": (lower_loss["test_bleu_mean"], higher_loss["test_bleu_mean"])})
    return found


def rank_disagreements_markdown(found: List[dict]) -> str:
    if not found:
        return ""
    lines = ["\nWhere validation loss and test BLEU rank two variants differently (means over the seeds that learned):\n"]
    for item in found:
        lines.append(f"- {item['data']}, {item['layers']} layers: {item['lower_loss']} has the lower best valid "
                     f"loss ({item['losses'][0]:.3f} vs {item['losses'][1]:.3f}), {item['higher_bleu']} the higher "
                     f"test sacreBLEU ({item['bleus'][1]:.2f} vs {item['bleus'][0]:.2f})")
    return "\n".join(lines) + "\n"


def _cell(mean, std):
    if mean is None:
        return "-"
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def _outcome_columns(metrics):
    """The columns naming seeds left out of the means: "did not learn" applies to translation only."""
    return (["did_not_learn"] if metrics is METRICS else []) + ["failed"]


def markdown_table(rows: List[dict], metrics=METRICS, extra_label: Optional[str] = None) -> str:
    """The rows of :func:`summarize`; ``extra_label``: the label of its ``extra_column``, shown after
    the depth."""
    outcomes = _outcome_columns(metrics)
    extra = [extra_label] if extra_label else []
    header = (["dataset", "variant", "layers"] + extra + ["seeds"] + [label for _, label in metrics]
              + [column.replace("_", " ") for column in outcomes])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = ([row.get("data", row["dataset"]), row["variant"], str(row["layers"])]
                 + [row[label].replace("|", "/") for label in extra] + [row["seeds"] or "-"])
        cells += [_cell(row[f"{column}_mean"], row[f"{column}_std"]) for column, _ in metrics]
        cells += [row.get(column, "").replace("|", "/") or "-" for column in outcomes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_table(rows: List[dict], metrics=METRICS, extra_label: Optional[str] = None) -> str:
    buffer = io.StringIO()
    extra = {extra_label.replace(" ", "_"): extra_label} if extra_label else {}  # field: the row's key
    fields = (["dataset", "variant", "layers"] + list(extra) + ["seeds"]
              + [f"{c}_{s}" for c, _ in metrics for s in ("mean", "std")] + _outcome_columns(metrics))
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        values = {**row, "dataset": row.get("data", row["dataset"]),  # the data's name (data_label)
                  **{field: row[key] for field, key in extra.items()}}
        writer.writerow({key: ("" if values[key] is None else values[key]) for key in fields})
    return buffer.getvalue()


def curves_figure(runs: List["Run"], not_learned=frozenset()):
    """The validation curves as a matplotlib figure.

    A panel per dataset and depth (with many runs one panel per dataset is unreadable), a
    colour per variant, every seed a line of that colour, and the validation BLEU in a row of
    its own only where some run has it. A run that did not learn (``not_learned``, keys as
    :func:`runs_that_did_not_learn`) is dotted, and the loss axis is fitted to the runs that
    learned, so that a plateau far above them does not flatten their curves; the runs it
    leaves above the axis are named under it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    curves = [(run, run.curve()) for run in runs]
    curves = [(run, curve) for run, curve in curves if curve]
    rows = []  # (dataset, metric, [layers ...])
    for dataset in dict.fromkeys(run.dataset for run, _ in curves):
        depths = sorted({run.layers for run, _ in curves if run.dataset == dataset})
        has_bleu = any(point["bleu"] is not None for run, curve in curves if run.dataset == dataset
                       for point in curve)
        rows += [(dataset, metric, depths) for metric in (("loss", "bleu") if has_bleu else ("loss",))]
    columns = max((len(depths) for _, _, depths in rows), default=1)
    panel_rows = max(len(rows), 1)
    figure, axes = plt.subplots(panel_rows, columns, figsize=(6.5 * columns, 3.8 * panel_rows), squeeze=False)
    for axis in axes.flat:
        axis.set_visible(False)
    for (dataset, metric, depths), axes_row in zip(rows, axes):
        for layers, axis in zip(depths, axes_row):
            axis.set_visible(True)
            panel = [(run, curve) for run, curve in curves if (run.dataset, run.layers) == (dataset, layers)]
            axis.set_xlabel("updates")
            _draw_panel(axis, panel, metric, not_learned)
            shown = "loss" if metric == "loss" else "BLEU"
            axis.set_title(f"{run_label(panel[0][0])}, {layers} layers: valid {shown}")
            axis.grid(alpha=0.3)
            variants = list(dict.fromkeys(run.variant for run, _ in panel))
            handles = [Line2D([], [], color=COLOURS[variant], label=variant) for variant in variants]
            if any(_key(run) in not_learned for run, _ in panel):
                handles.append(Line2D([], [], color="grey", linestyle=":", label="did not learn"))
            # Beside the panel, not on it: inside, wherever it sat, a slow run's tail ran under it.
            axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if not rows:
        axes[0][0].set_visible(True)
        axes[0][0].text(0.5, 0.5, "no validation yet", ha="center", va="center", color="grey")
    figure.tight_layout()
    return figure


def _draw_panel(axis, panel, metric: str, not_learned) -> None:
    """One panel's lines of ``metric`` ("loss" or "bleu", a curve point's keys); for the loss, the
    axis fitted to the runs that learned (see curves_figure)."""
    for run, curve in panel:
        points = [(point["updates"], point[metric]) for point in curve if point[metric] is not None]
        if points:
            failed = _key(run) in not_learned
            axis.plot(*zip(*points), ":" if failed else "-", color=COLOURS[run.variant], marker="o",
                      markersize=2 if failed else 3, linewidth=1 if failed else 1.5, alpha=0.85)
    if metric != "loss" or all(_key(run) not in not_learned for run, _ in panel):
        return
    learned = _finite_losses(curve for run, curve in panel if _key(run) not in not_learned)
    if not learned:
        return
    # Only the top is cut: a run that did not learn is hidden only where it is above them all.
    low, high = min(_finite_losses(curve for _, curve in panel)), max(learned)
    margin = 0.05 * (high - low or 1.0)
    axis.set_ylim(low - margin, high + margin)
    above = {}  # variant -> (seeds, highest loss) of its runs that reach above the axis
    for run, curve in panel:
        highest = max((point["loss"] for point in curve), key=_height)
        if _height(highest) > _height(high + margin):
            seeds, top = above.get(run.variant, ([], highest))
            above[run.variant] = (seeds + [str(run.seed)], max(top, highest, key=_height))
    if above:  # a line per variant: on one line two or more ran off the figure's edge
        names = "\n".join(f"{variant} seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} (up to {top:.2f})"
                           for variant, (seeds, top) in above.items())
        axis.set_xlabel(f"updates\nreaching above the axis:\n{names}")


def _height(loss: float) -> tuple:
    """Where a loss sits on the axis: a nan (a diverged validation) above every number but inf.
    Plain max() cannot rank it: nan compares false, so the result depends on where it falls."""
    return (math.inf, 0) if math.isnan(loss) else (loss, 1)


def _finite_losses(curves) -> list:
    """Every validation loss of ``curves`` but a diverged run's inf/nan."""
    return [point["loss"] for curve in curves for point in curve if is_finite_number(point["loss"])]


def plot_curves(runs: List["Run"], path: Path, not_learned=frozenset()) -> Path:
    """Write :func:`curves_figure` to ``path`` (a PNG, atomically)."""
    import matplotlib.pyplot as plt

    figure = curves_figure(runs, not_learned)
    path = Path(path)
    with atomic_output(path) as tmp:
        figure.savefig(tmp, dpi=110, format="png")
    plt.close(figure)
    return path


# Every file write_reports writes into OUT.
REPORT_NAMES = ("results.md", "results.csv", "results-lm.md", "results-lm.csv", "runs.md", "runs.json", "curves.png")


def write_reports(runs: List["Run"], out: Path, extra_column=None) -> dict:
    """results.md/.csv (mean ± std per variant; the markdown adds which differences are beyond
    seed noise), runs.md/.json (every run) and curves.png in ``out``; returns their paths.
    ``extra_column``: a column per row of the tables (see :func:`summarize`)."""
    not_learned = runs_that_did_not_learn(runs)
    rows = summarize(runs, not_learned, extra_column)
    label = extra_column[0] if extra_column is not None else None
    noise = seed_noise(runs, not_learned=not_learned)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md", "csv": out / "results.csv", "png": out / "curves.png"}
    lm_rows = [row for row in rows if is_language_model(row["dataset"])]
    if lm_rows:  # language models get their own table (perplexities, not BLEU)
        rows = [row for row in rows if not is_language_model(row["dataset"])]
        paths["lm_markdown"], paths["lm_csv"] = out / "results-lm.md", out / "results-lm.csv"
        write_text_atomically(paths["lm_markdown"], markdown_table(lm_rows, LM_METRICS, label) + seed_noise_markdown(
            [row for row in noise if is_language_model(row["dataset"])]))
        write_text_atomically(paths["lm_csv"], csv_table(lm_rows, LM_METRICS, label))
    translation_noise = (seed_noise_markdown([row for row in noise if not is_language_model(row["dataset"])])
                         + rank_disagreements_markdown(rank_disagreements(rows)))
    # A matrix of language models only: results.md says where its table is, not an empty table.
    translation_table = (markdown_table(rows, METRICS, label) if rows or not lm_rows
                         else "No translation runs in this matrix: the language models' table is results-lm.md.\n")
    for key, text in (("markdown", translation_table + translation_noise),
                      ("csv", csv_table(rows, METRICS, label))):
        write_text_atomically(paths[key], text)
    records = [run_record(run, _key(run) in not_learned) for run in runs]
    paths["runs_markdown"], paths["runs_json"] = out / "runs.md", out / "runs.json"
    write_text_atomically(paths["runs_markdown"], runs_markdown(records))
    write_text_atomically(paths["runs_json"], json.dumps(records, indent=1) + "\n")
    plot_curves(runs, paths["png"], not_learned)
    return paths
