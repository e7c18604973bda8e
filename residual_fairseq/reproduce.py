"""Run the paper's matrix (dataset x variant x depth x seed) and tabulate it.

Each run trains with :mod:`residual_fairseq.train` (which resumes an interrupted
run) and is then evaluated on the test set with
:func:`residual_fairseq.evaluate.evaluate_run`; a run whose ``result.json`` exists
is finished and skipped. The results are summarized as mean +/- std over seeds in
``OUT/results.md`` and ``OUT/results.csv``, every run as it stands (seed by seed) in
``OUT/runs.md`` and ``OUT/runs.json``, and the validation loss/BLEU curves parsed from
each run's JSON log are drawn in ``OUT/curves.png``. ``--jobs N`` runs N at a time.

Layout::

    OUT/runs/<dataset>/<variant>-<L>l/seed<S>/   checkpoints, train.log, run.json, result.json
    OUT/results.md  OUT/results.csv  OUT/runs.md  OUT/runs.json  OUT/curves.png

CLI::

    residual-fairseq-reproduce --dataset sample-es-en --data data/sample/bin \\
        --variants post_ln resi_dual --seeds 1 2 --out results/sample
"""
import argparse
import csv
import io
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from . import configs, train
from .argtypes import check_output_dir, int_at_least, positive_int, shell_words
from .atomic import atomic_output, write_text_atomically
from .data.pipeline import is_prepare_manifest, read_manifest
from .errors import UserError, cli_main
from .runtime import add_threads_flag, add_verbose_flag, available_cores
from .variants import COLOURS, VARIANTS

RESULT_NAME = "result.json"
FAILURE_NAME = "failed.json"   # a run that failed: its error, shown in the table; removed by a later success
METRICS = (  # (column, label in the markdown table)
    ("test_bleu", "test sacreBLEU"),
    ("test_chrf", "test chrF"),
    ("test_tok_bleu", "test tok. BLEU"),
    ("best_valid_bleu", "best valid BLEU"),
    ("best_valid_loss", "best valid loss"),   # the checkpoint_best.pt that is scored
    ("last_valid_loss", "last valid loss"),
)
# Language models (configs whose DatasetSpec.task is language_modeling): perplexities.
LM_METRICS = (
    ("test_ppl", "test perplexity"),
    ("test_loss", "test loss (base 2)"),
    ("best_valid_ppl", "best valid perplexity"),
)
_VALID_LINE = re.compile(r"\| valid \| (\{.*\})\s*$")
_EARLY_STOP = re.compile(r"early stop since valid performance hasn't improved for last (\d+) runs")


@dataclass(frozen=True)
class Run:
    dataset: str
    variant: str
    layers: int
    seed: int
    data: Path
    out: Path

    @property
    def save_dir(self) -> Path:
        return self.out / "runs" / self.dataset / configs.config_name(self.variant, self.layers) / f"seed{self.seed}"

    @property
    def result_path(self) -> Path:
        return self.save_dir / RESULT_NAME

    @property
    def finished(self) -> bool:
        return self.result_path.is_file()

    def result(self) -> dict:
        """result.json, checked: UserError naming it when it is not what evaluation writes."""
        try:
            result = json.loads(self.result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            result, problem = None, f"cannot be read ({err.__class__.__name__})"
        else:
            scores = ((("perplexity",), ("loss_base2",)) if is_language_model(self.dataset)
                      else (("sacrebleu", "score"), ("chrf", "score")))
            missing = [".".join(keys) for keys in scores if not _is_number(_dig(result, keys))]
            problem = f"has no numeric {', '.join(missing)}" if missing else None
        if problem:
            raise UserError(f"{self.result_path} {problem}: it is not a result this tool wrote; "
                            f"delete it to evaluate the run again")
        return result

    @property
    def label(self) -> str:
        return f"{self.dataset} {self.variant} {self.layers}L seed {self.seed}"

    @property
    def failure_path(self) -> Path:
        return self.save_dir / FAILURE_NAME

    @property
    def failure(self) -> Optional[str]:
        """The error of this run's last attempt, when it failed."""
        if self.finished or not self.failure_path.is_file():
            return None
        try:
            return json.loads(self.failure_path.read_text(encoding="utf-8")).get("error", "failed")
        except (ValueError, UnicodeDecodeError):
            return "failed"


def _dig(value, keys):
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def matrix(data: dict, out: Path, variants=None, layers=None, seeds=(1,)) -> List[Run]:
    """Every run of the matrix; ``data`` maps each dataset to its fairseq data directory.

    ``variants`` None means every variant of each dataset's task (language models: three).
    ``layers`` None means each dataset's shipped depths; any other depth is composed
    from the dataset's base.yaml (as ``residual-fairseq-train --layers`` does).
    """
    runs = []
    for dataset, data_dir in data.items():
        for depth in (layers or configs.DATASETS[dataset].depths):
            for variant in (variants or configs.DATASETS[dataset].variants):
                configs.check_choice(dataset, variant, depth, shipped_only=False)
                runs += [Run(dataset, variant, depth, seed, Path(data_dir), Path(out)) for seed in seeds]
    return runs


def train_request(run: Run, nprocs: int = 1, extra_args=(), threads=None) -> train.TrainRequest:
    return train.TrainRequest(run.dataset, run.variant, run.layers, run.data, run.save_dir, seed=run.seed,
                              nprocs=nprocs, extra_args=list(extra_args), threads=threads)


def checkpoint_to_evaluate(run: Run) -> Path:
    """checkpoint_best.pt, else (a run trained without validation has none) checkpoint_last.pt, saying so."""
    best = run.save_dir / "checkpoint_best.pt"
    if best.is_file():
        return best
    last = run.save_dir / "checkpoint_last.pt"
    if last.is_file():
        print(f"note: {run.save_dir} has no checkpoint_best.pt (trained without validation?): "
              f"evaluating checkpoint_last.pt", flush=True)
        return last
    raise UserError(f"{run.save_dir} holds neither checkpoint_best.pt nor checkpoint_last.pt")


def evaluation_options(run: Run) -> dict:
    """evaluate_run keyword arguments: the dataset's choices plus how the data were segmented."""
    options = dict(configs.DATASETS[run.dataset].evaluation)
    manifest = read_manifest(run.data.parent)  # residual-fairseq-prepare's OUT/bin layout
    if is_prepare_manifest(manifest):
        method = _dig(manifest, ("subword", "method"))
        if not isinstance(method, str):
            raise UserError(f"{run.data.parent / 'manifest.json'} names no subword method: re-run "
                            f"residual-fairseq-prepare, or give data prepared elsewhere without its manifest.json")
        options["subword"] = method
        if _dig(manifest, ("settings", "tokenizer")) == "moses":
            options["detok_lang"] = str(manifest["target_lang"])
    else:
        # Not prepared by us: infer from the config's validation-BLEU settings.
        task = configs.load(run.dataset, run.variant, run.layers)["task"]
        options["subword"] = {"@@ ": "subword_nmt", "sentencepiece": "sentencepiece"}.get(
            task.get("eval_bleu_remove_bpe"), "none")
        if task.get("eval_bleu_detok") == "moses":
            options["detok_lang"] = task.get("target_lang")
    return options


def run_one(run: Run, nprocs: int = 1, extra_args=(), eval_overrides=None, dry_run: bool = False,
            threads=None) -> Optional[dict]:
    """Train (or resume) and evaluate one run; returns its result (None in a dry run).

    ``eval_overrides`` are evaluate_run keyword arguments that win over the dataset's.
    """
    if run.finished:
        print(f"skip {run.label}: finished ({run.result_path})", flush=True)
        return run.result()
    print(f"=== {run.label} -> {run.save_dir}", flush=True)
    train.train(train_request(run, nprocs, extra_args, threads), dry_run=dry_run)
    if is_language_model(run.dataset):
        return evaluate_language_model(run, eval_overrides, dry_run, threads)
    options = {**evaluation_options(run), **(eval_overrides or {})}
    if dry_run:
        shown = ", ".join(f"{key}={value!r}" for key, value in options.items())
        print(f"would evaluate: evaluate_run({str(run.save_dir)!r}, {str(run.data)!r}, {shown})", flush=True)
        return None
    from .evaluate import evaluate_run

    return evaluate_run(checkpoint_to_evaluate(run), run.data, out_json=run.result_path, threads=threads,
                        **options)


def is_language_model(dataset: str) -> bool:
    return configs.DATASETS[dataset].task == "language_modeling"


def metrics_for(dataset: str):
    return LM_METRICS if is_language_model(dataset) else METRICS


def evaluate_language_model(run: Run, eval_overrides=None, dry_run: bool = False, threads=None) -> Optional[dict]:
    """Test perplexity with fairseq-eval-lm and the dataset's context-window settings."""
    from .language_models import eval_lm_command, evaluate_lm

    options = {**configs.DATASETS[run.dataset].evaluation, **(eval_overrides or {})}
    options = {key: value for key, value in options.items() if key in ("tokens_per_sample", "context_window",
                                                                       "max_tokens", "extra_args")}
    if dry_run:
        checkpoint = run.save_dir / "checkpoint_best.pt"
        print("would evaluate: " + shlex.join(eval_lm_command(checkpoint, run.data, **options)), flush=True)
        return None
    return evaluate_lm(checkpoint_to_evaluate(run), run.data, out_json=run.result_path, threads=threads, **options)


# --- collecting ----------------------------------------------------------------------------

def validation_curve(log_path: Path) -> List[dict]:
    """(updates, loss, bleu) of every validation in a fairseq ``--log-format json`` log file."""
    points = []
    if not Path(log_path).is_file():
        return points
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        match = _VALID_LINE.search(line)
        if not match:
            continue
        try:
            stats = json.loads(match.group(1))
            bleu = stats.get("valid_bleu")
            points.append({"epoch": int(float(stats.get("epoch", 0))),
                           "updates": int(float(stats["valid_num_updates"])), "loss": float(stats["valid_loss"]),
                           "bleu": float(bleu) if bleu is not None else None})
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # not a line fairseq wrote (a damaged or edited log): it is not a validation
    return points


def run_metrics(run: Run) -> dict:
    """The numbers one finished run contributes to the table."""
    result = run.result()
    curve = validation_curve(run.save_dir / train.LOG_NAME)
    if is_language_model(run.dataset):
        return {"test_ppl": result["perplexity"], "test_loss": result["loss_base2"],
                "best_valid_ppl": min((2 ** point["loss"] for point in curve), default=None)}
    bleus = [point["bleu"] for point in curve if point["bleu"] is not None]
    return {
        "test_bleu": result["sacrebleu"]["score"],
        "test_chrf": result["chrf"]["score"],
        "test_tok_bleu": _dig(result, ("tokenized_bleu", "score")) if _is_number(_dig(result, ("tokenized_bleu", "score")))
        else None,
        "best_valid_bleu": max(bleus) if bleus else None,
        "best_valid_loss": min((point["loss"] for point in curve), default=None),
        "last_valid_loss": curve[-1]["loss"] if curve else None,
    }


def how_training_ended(log_path: Path) -> Optional[str]:
    """'patience N' (fairseq stopped early), 'budget' (--max-epoch/--max-update reached), None (unknown/running).

    Only the log's last session counts: a resumed run appends to it.
    """
    if not Path(log_path).is_file():
        return None
    ended = None
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        early = _EARLY_STOP.search(line)
        if early:
            ended = f"patience {early.group(1)}"
        elif "| fairseq_cli.train | done training in" in line:
            ended = ended or "budget"
        elif "| fairseq_cli.train | {'_name'" in line:  # fairseq's config dump: a (re)start
            ended = None
    return ended


def run_record(run: Run) -> dict:
    """One run as it stands: its status, every validation, where its best was, its test numbers."""
    curve = validation_curve(run.save_dir / train.LOG_NAME)
    best = min(curve, key=lambda point: point["loss"]) if curve else None
    status = "finished" if run.finished else ("failed" if run.failure else ("unfinished" if curve else "not started"))
    record = {"dataset": run.dataset, "variant": run.variant, "layers": run.layers, "seed": run.seed,
              "status": status, "epochs": curve[-1]["epoch"] if curve else None,
              "ended_by": how_training_ended(run.save_dir / train.LOG_NAME),
              "best_valid_loss": best["loss"] if best else None, "best_epoch": best["epoch"] if best else None}
    if run.finished:
        result = run.result()
        record.update({column: value for column, value in run_metrics(run).items() if column.startswith("test_")})
        record["checkpoint"] = Path(str(result.get("checkpoint", "?"))).name
        if "sacrebleu" in result:
            record["beam"] = _dig(result, ("generation", "beam"))
            record["sacrebleu_signature"] = _dig(result, ("sacrebleu", "signature"))
    if run.failure:
        record["error"] = run.failure
    record["validations"] = curve
    return record


def runs_markdown(records: List[dict]) -> str:
    """A row per run: status, epochs, best validation, test numbers (the columns its runs have)."""
    tests = [(column, label) for column, label in METRICS + LM_METRICS
             if column.startswith("test_") and any(column in record for record in records)]
    header = ["dataset", "variant", "layers", "seed", "status", "epochs (ended by)", "best valid loss (epoch)"]
    lines = ["| " + " | ".join(header + [label for _, label in tests]) + " |", "|" + "---|" * (len(header) + len(tests))]
    for record in records:
        epochs = "-" if record["epochs"] is None else f"{record['epochs']} ({record['ended_by'] or '-'})"
        best = "-" if record["best_valid_loss"] is None else f"{record['best_valid_loss']:.3f} ({record['best_epoch']})"
        cells = [record["dataset"], record["variant"], str(record["layers"]), str(record["seed"]), record["status"],
                 epochs, best] + ["-" if record.get(column) is None else f"{record[column]:.2f}" for column, _ in tests]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mean_std(values):
    """Mean and sample standard deviation (None when there are fewer than 2 values)."""
    values = [value for value in values if value is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


def summarize(runs: List[Run]) -> List[dict]:
    """One row per (dataset, variant, layers) over the finished seeds; failed seeds are named in ``failed``."""
    groups = {}
    for run in runs:
        if run.finished or run.failure:
            groups.setdefault((run.dataset, run.variant, run.layers), []).append(run)
    rows = []
    for (dataset, variant, layers), members in groups.items():
        finished = [run for run in members if run.finished]
        metrics = [run_metrics(run) for run in finished]
        row = {"dataset": dataset, "variant": variant, "layers": layers,
               "seeds": " ".join(str(run.seed) for run in finished),
               "failed": "; ".join(f"seed {run.seed}: {run.failure}" for run in members if not run.finished)}
        for column, _ in metrics_for(dataset):
            row[f"{column}_mean"], row[f"{column}_std"] = mean_std([m[column] for m in metrics])
        rows.append(row)
    return rows


# The test metrics compared across variants for seed noise, and which way is better.
NOISE_METRICS = {"test_bleu": ("test sacreBLEU", max), "test_chrf": ("test chrF", max),
                 "test_ppl": ("test perplexity", min)}
NOISE_ALPHA = 0.05


def seed_noise(runs: List[Run], alpha: float = NOISE_ALPHA) -> List[dict]:
    """Per dataset, depth and test metric: each variant against the best one, by Welch's
    t-test over their seeds (two-sided; variants with fewer than 2 finished seeds are left out).

    A difference is "beyond seed noise" when p < ``alpha``. No correction for the several
    comparisons is made: with 3 seeds a test this small is a guide, not proof.
    """
    values = {}  # (dataset, layers, metric) -> {variant: [one value per seed]}
    for run in runs:
        if run.finished:
            metrics = run_metrics(run)
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
            verdict = ("no spread to test" if math.isnan(p_value)
                       else "beyond seed noise" if p_value < alpha else "within seed noise")
            rows.append({"dataset": dataset, "layers": layers, "metric": label, "best": best, "variant": variant,
                         "difference": mean_std(seeds)[0] - mean_std(seeded[best])[0], "p": p_value,
                         "verdict": verdict})
    return rows


def seed_noise_markdown(rows: List[dict]) -> str:
    if not rows:
        return ""
    lines = [f"\nEach variant against the best, Welch's t-test over the seeds (two-sided, p < {NOISE_ALPHA}; "
             "no correction for the several comparisons; a variant with one finished seed is left out):\n",
             "| dataset | layers | metric | best | variant | difference | p | verdict |", "|" + "---|" * 8]
    for row in rows:
        p_value = "-" if math.isnan(row["p"]) else f"{row['p']:.3f}"
        lines.append(f"| {row['dataset']} | {row['layers']} | {row['metric']} | {row['best']} | {row['variant']} | "
                     f"{row['difference']:+.2f} | {p_value} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def _cell(mean, std):
    if mean is None:
        return "-"
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def markdown_table(rows: List[dict], metrics=METRICS) -> str:
    header = ["dataset", "variant", "layers", "seeds"] + [label for _, label in metrics] + ["failed"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["dataset"], row["variant"], str(row["layers"]), row["seeds"] or "-"]
        cells += [_cell(row[f"{column}_mean"], row[f"{column}_std"]) for column, _ in metrics]
        cells.append(row.get("failed", "").replace("|", "/") or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_table(rows: List[dict], metrics=METRICS) -> str:
    buffer = io.StringIO()
    fields = (["dataset", "variant", "layers", "seeds"] + [f"{c}_{s}" for c, _ in metrics for s in ("mean", "std")]
              + ["failed"])
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: ("" if row[key] is None else row[key]) for key in fields})
    return buffer.getvalue()


def plot_curves(runs: List[Run], path: Path) -> Path:
    """Validation loss and BLEU against updates: a row per dataset, a colour per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(run.dataset for run in runs))
    figure, axes = plt.subplots(len(datasets), 2, figsize=(11, 3.6 * len(datasets)), squeeze=False)
    colours = COLOURS  # the same colour per variant in every tool's plots
    styles = {}
    for run in runs:
        curve = validation_curve(run.save_dir / train.LOG_NAME)
        if not curve:
            continue
        row = axes[datasets.index(run.dataset)]
        style = styles.setdefault(run.layers, ("-", "--", ":", "-.")[len(styles) % 4])
        label = f"{run.variant} {run.layers}L seed {run.seed}"
        updates = [point["updates"] for point in curve]
        row[0].plot(updates, [point["loss"] for point in curve], style, color=colours[run.variant],
                    marker="o", markersize=3, label=label)
        bleu_points = [(point["updates"], point["bleu"]) for point in curve if point["bleu"] is not None]
        if bleu_points:
            row[1].plot(*zip(*bleu_points), style, color=colours[run.variant], marker="o", markersize=3,
                        label=label)
    for dataset, row in zip(datasets, axes):
        for axis, what in zip(row, ("valid loss", "valid BLEU")):
            axis.set_title(f"{dataset}: {what}")
            axis.set_xlabel("updates")
            axis.grid(alpha=0.3)
            if axis.get_lines():
                axis.legend(fontsize=7)
            elif what == "valid BLEU":
                axis.text(0.5, 0.5, "no validation BLEU\n(trained without --eval-bleu)", ha="center", va="center",
                          transform=axis.transAxes, color="grey")
    figure.tight_layout()
    path = Path(path)
    with atomic_output(path) as tmp:
        figure.savefig(tmp, dpi=110, format="png")
    plt.close(figure)
    return path


def write_reports(runs: List[Run], out: Path) -> dict:
    """results.md/.csv (mean ± std per variant; the markdown adds which differences are beyond
    seed noise), runs.md/.json (every run) and curves.png in ``out``; returns their paths."""
    rows = summarize(runs)
    noise = seed_noise(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md", "csv": out / "results.csv", "png": out / "curves.png"}
    lm_rows = [row for row in rows if is_language_model(row["dataset"])]
    if lm_rows:  # language models get their own table (perplexities, not BLEU)
        rows = [row for row in rows if not is_language_model(row["dataset"])]
        paths["lm_markdown"], paths["lm_csv"] = out / "results-lm.md", out / "results-lm.csv"
        write_text_atomically(paths["lm_markdown"], markdown_table(lm_rows, LM_METRICS) + seed_noise_markdown(
            [row for row in noise if is_language_model(row["dataset"])]))
        write_text_atomically(paths["lm_csv"], csv_table(lm_rows, LM_METRICS))
    translation_noise = seed_noise_markdown([row for row in noise if not is_language_model(row["dataset"])])
    for key, text in (("markdown", markdown_table(rows) + translation_noise), ("csv", csv_table(rows))):
        write_text_atomically(paths[key], text)
    records = [run_record(run) for run in runs]
    paths["runs_markdown"], paths["runs_json"] = out / "runs.md", out / "runs.json"
    write_text_atomically(paths["runs_markdown"], runs_markdown(records))
    write_text_atomically(paths["runs_json"], json.dumps(records, indent=1) + "\n")
    plot_curves(runs, paths["png"])
    return paths


def reproduce(runs: List[Run], out: Path, nprocs: int = 1, extra_args=(), eval_overrides=None,
              dry_run: bool = False, threads=None, jobs: int = 1, verbose: bool = False, report: bool = True):
    """Run (or skip) every run, then write the reports; returns the report paths (None if dry).

    ``jobs`` > 1 runs that many at a time, each in its own driver process
    (:func:`run_in_parallel`). A run that fails (its training or evaluation raised a
    UserError) is recorded in its ``failed.json`` and reported in the table; the other
    runs go on. Raises UserError at the end when any run failed. ``report`` False skips
    the tables (a driver started by :func:`run_in_parallel`: its parent writes them).
    """
    if jobs > 1 and not dry_run:
        failed = run_in_parallel(runs, jobs, nprocs, extra_args, eval_overrides, threads, verbose)
    else:
        failed = []
        for run in runs:
            try:
                run_one(run, nprocs, extra_args, eval_overrides, dry_run, threads)
            except UserError as err:
                if dry_run:
                    raise
                print(f"error: {run.label} failed: {err}", flush=True)
                write_text_atomically(run.failure_path, json.dumps({"error": str(err)}) + "\n")
                failed.append(run)
            else:
                if run.failure_path.is_file():
                    run.failure_path.unlink()
    if dry_run:
        return None
    paths = None
    if report:
        paths = write_reports(runs, out)
        for key in ("markdown", "lm_markdown"):
            if key in paths:
                print(Path(paths[key]).read_text(encoding="utf-8"), end="")
        print("wrote " + ", ".join(str(path) for path in paths.values()), flush=True)
    if failed:
        where = f" (see the 'failed' column of {paths['markdown']})" if paths else ""
        raise UserError(f"{len(failed)} of {len(runs)} runs failed{where}")
    return paths


# --- several runs at a time ------------------------------------------------------------------

DRIVER_LOG_NAME = "reproduce.log"   # a run's driver output (training notes, evaluation) under --jobs


def threads_per_job(jobs: int, threads=None) -> int:
    """``--threads`` as given (per run), else the cores shared out between the jobs."""
    return threads if threads is not None else max(1, available_cores() // jobs)


def driver_command(run: Run, nprocs: int, extra_args, eval_overrides, threads: int, verbose: bool) -> List[str]:
    """This CLI for ``run`` alone, without the tables (its parent writes them)."""
    command = [sys.executable, "-m", "residual_fairseq.reproduce", "--dataset", run.dataset,
               "--data", f"{run.dataset}={run.data}", "--variants", run.variant, "--layers", str(run.layers),
               "--seeds", str(run.seed), "--out", str(run.out), "--nprocs", str(nprocs),
               "--threads", str(threads), "--no-report"]
    overrides = eval_overrides or {}
    if overrides.get("beam") is not None:
        command += ["--beam", str(overrides["beam"])]
    if overrides.get("generate_args"):
        command += ["--generate-args", shlex.join(overrides["generate_args"])]
    if verbose:
        command.append("--verbose")
    return command + ["--", *extra_args]


def driver_environment(environ=None) -> dict:
    """The environment of a run's driver: it imports this very residual_fairseq, installed
    or not (``python scripts/reproduce.py`` from a source checkout)."""
    env = dict(os.environ if environ is None else environ)
    source_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([source_root] + [path for path in env.get("PYTHONPATH", "").split(os.pathsep)
                                                         if path])
    return env


def run_in_parallel(runs: List[Run], jobs: int, nprocs: int = 1, extra_args=(), eval_overrides=None,
                    threads=None, verbose: bool = False) -> List[Run]:
    """Run the unfinished runs, ``jobs`` at a time; returns the runs that failed.

    Each run is this CLI for that run alone, in its own process group, its output in
    ``SAVE_DIR/reproduce.log`` (fairseq's log stays in ``train.log``); the console gets
    one line when a run starts and one when it ends. SIGTERM/SIGINT reach every running
    run (each stops its fairseq-train), no new run starts, and this process then ends
    by the same signal; killed outright, it takes the runs with it.
    """
    threads = threads_per_job(jobs, threads)
    pending = []
    for run in runs:
        if run.finished:
            print(f"skip {run.label}: finished ({run.result_path})", flush=True)
        else:
            pending.append(run)
    print(f"{len(pending)} runs to do, {jobs} at a time, {threads} CPU thread{'s' if threads != 1 else ''} each",
          flush=True)
    processes, active, failed = [], {}, []
    environment = driver_environment()
    with train.forwarding_stop_signals(processes) as received:
        stop_deadline = None
        try:
            while active or (pending and not received):
                while pending and len(active) < jobs and not received:
                    run = pending.pop(0)
                    run.save_dir.mkdir(parents=True, exist_ok=True)
                    log_path = run.save_dir / DRIVER_LOG_NAME
                    with open(log_path, "a", encoding="utf-8") as log:
                        process = subprocess.Popen(
                            driver_command(run, nprocs, extra_args, eval_overrides, threads, verbose),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                            start_new_session=True, preexec_fn=train.die_with_the_driver())
                    processes.append(process)
                    active[process] = (run, log_path, time.time())
                    print(f"started {run.label} (log: {log_path})", flush=True)
                for process in [process for process in active if process.poll() is not None]:
                    run, log_path, started = active.pop(process)
                    if _report_finished_run(run, process.returncode, log_path, started, interrupted=bool(received)):
                        failed.append(run)
                if received and stop_deadline is None:
                    stop_deadline = time.monotonic() + train.STOP_GRACE_SECONDS + 10
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    train.kill_groups(list(active), signal.SIGKILL)
                time.sleep(0.2)
        finally:
            train.kill_groups(list(active), signal.SIGTERM)
            for process in active:
                process.wait()
    if received:
        signal.raise_signal(received[0])  # die as the signal asked (SIGINT: KeyboardInterrupt)
    return failed


def _report_finished_run(run: Run, returncode: int, log_path: Path, started: float, interrupted: bool) -> bool:
    """Say how a run's driver ended; True when the run failed."""
    minutes = (time.time() - started) / 60
    if run.finished:  # its result.json is written: that is what finished means here
        print(f"finished {run.label} in {minutes:.1f} min", flush=True)
        return False
    if interrupted:
        print(f"stopped {run.label} (log: {log_path})", flush=True)
        return False
    stale = not run.failure_path.is_file() or run.failure_path.stat().st_mtime < started
    if stale:  # it ended without saying why (killed, or a crash): record that
        write_text_atomically(run.failure_path, json.dumps(
            {"error": f"its driver exited {returncode} (log: {log_path})"}) + "\n")
    print(f"error: {run.label} failed: {run.failure} (log: {log_path})", flush=True)
    return True


# --- CLI -------------------------------------------------------------------------------------

def parse_data(values, datasets) -> dict:
    """``--data DIR`` (one dataset) or ``--data DATASET=DIR`` (any number)."""
    data = {}
    for value in values:
        dataset, sep, directory = value.partition("=")
        if not sep:
            if len(datasets) != 1:
                raise UserError("with several --dataset values give --data DATASET=DIR for each")
            dataset, directory = datasets[0], value
        data[dataset] = directory
    missing = [dataset for dataset in datasets if dataset not in data]
    unknown = [dataset for dataset in data if dataset not in datasets]
    if missing or unknown:
        raise UserError(f"--data must name each --dataset once (missing: {', '.join(missing) or '-'}; "
                        f"not in --dataset: {', '.join(unknown) or '-'})")
    return {dataset: data[dataset] for dataset in datasets}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-reproduce",
        description="Train and evaluate dataset x variant x depth x seed, skipping finished runs, "
                    "and tabulate mean ± std over seeds. Flags after -- go to every fairseq-train.",
    )
    parser.add_argument("--dataset", nargs="+", required=True, choices=list(configs.DATASETS))
    parser.add_argument("--data", nargs="+", required=True, metavar="[DATASET=]DIR",
                        help="fairseq data directory (the prepared bin/) of each dataset")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        help="default: every variant of each dataset's task (language models: post_ln pre_ln resi_dual)")
    parser.add_argument("--layers", nargs="+", type=int_at_least(1, configs.MAX_LAYERS),
                        help="depths, any (default: each dataset's shipped depths)")
    parser.add_argument("--seeds", nargs="+", type=int_at_least(0), default=[1])
    parser.add_argument("--out", required=True, help="runs and reports go here")
    parser.add_argument("--nprocs", type=positive_int, default=1, help="processes per training (see residual-fairseq-train)")
    parser.add_argument("--beam", type=int_at_least(1, 1000), help="test-set beam size (default: the dataset's)")
    parser.add_argument("--generate-args", type=shell_words, default=[],
                        help='extra fairseq-generate flags for the test set, e.g. "--max-len-b 50"')
    add_threads_flag(parser)
    add_verbose_flag(parser)
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="runs at a time, each with --threads threads (default: the cores shared out); "
                             "on one GPU they share it")
    parser.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)  # a --jobs run: its parent reports
    parser.add_argument("--report-only", action="store_true", help="only (re)write the tables and plot")
    parser.add_argument("--dry-run", action="store_true", help="print every command without running")
    return parser


@cli_main
def main(argv=None):
    ours, passthrough = train.split_passthrough(argv)
    args = build_parser().parse_args(ours)
    check_output_dir(args.out, "--out")
    train.check_extra_args(passthrough)
    depth_flags = [word for word in passthrough if word.split("=")[0] in ("--encoder-layers", "--decoder-layers")]
    if depth_flags:
        raise UserError(f"{depth_flags[0]} after --: give depths with --layers, so that run names and "
                        f"tables show them")
    args.layers = sorted(set(args.layers), key=args.layers.index) if args.layers else None
    args.seeds = sorted(set(args.seeds), key=args.seeds.index)
    data = parse_data(args.data, args.dataset)
    runs = matrix(data, Path(args.out), args.variants, args.layers, args.seeds)
    print(f"{len(runs)} runs ({sum(run.finished for run in runs)} finished); extra fairseq flags: "
          f"{shlex.join(passthrough) or '-'}", flush=True)
    if args.report_only:
        paths = write_reports(runs, Path(args.out))
        print("wrote " + ", ".join(str(path) for path in paths.values()))
        return
    eval_overrides = {"generate_args": args.generate_args} if args.generate_args else {}
    if args.beam:
        eval_overrides["beam"] = args.beam
    reproduce(runs, Path(args.out), args.nprocs, passthrough, eval_overrides, args.dry_run, args.threads,
              jobs=args.jobs, verbose=args.verbose, report=not args.no_report)


if __name__ == "__main__":
    main()
