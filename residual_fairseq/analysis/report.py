"""Every number as JSON and CSV, and the figures that show them at a glance."""
import csv
import dataclasses
import json
import math
from dataclasses import MISSING, asdict
from pathlib import Path
from typing import Dict, List

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from ..variants import COLOURS, DISPLAY_NAMES  # noqa: E402
from .probe import STACKS, Measurement, StackMeasurement  # noqa: E402
from .training import Run  # noqa: E402

FP16_MAX = 65504.0
# One colour and name per variant, shared with the other tools' plots.
COLORS = COLOURS
LABELS = DISPLAY_NAMES

# (CSV file, the StackMeasurement fields it holds); layer-indexed fields only.
TABLES = {
    "gradients.csv": ("param_grad_norm", "input_grad_norm"),
    "similarity.csv": ("output_norm", "cos_next", "cos_last", "cka_next", "cka_last"),
    "dual_stream.csv": ("dual_norm", "dual_max_abs", "dual_cos_next"),
}


# A measurement's fields besides its stacks (see runs_to_dict).
MEASUREMENT_FIELDS = {"step", "loss", "loss_other_source"}


def _stacks(runs: List[Run]) -> List[str]:
    """The stacks measured (language models have only the decoder)."""
    return [name for name in STACKS if name in runs[0].measurements[0].stacks]


def runs_to_dict(runs: List[Run], settings: Dict) -> Dict:
    return {
        "settings": settings,
        "runs": [
            {
                "label": run.label,
                "diverged_at": run.diverged_at,
                "train_loss": run.train_loss,
                "measurements": [
                    {"step": step, "loss": m.loss, "loss_other_source": m.loss_other_source,
                     **{name: asdict(s) for name, s in m.stacks.items()}}
                    for step, m in zip(run.steps, run.measurements)
                ],
            }
            for run in runs
        ],
    }


# Every number measured is a float32's (or a double computed from float32s): a larger one
# was not written by analyze, and it overflows matplotlib's axis arithmetic.
LARGEST_MEASURED = float(np.finfo(np.float32).max)


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return True  # NaN/inf: a diverged run's
    return abs(value) <= LARGEST_MEASURED


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def _check_numbers(value, where: str) -> None:
    if not isinstance(value, list) or not all(_is_number(item) for item in value):
        raise ValueError(f"{where} is not a list of numbers (each NaN, inf or at most {LARGEST_MEASURED:.4g} in size)")


def check_report(report) -> None:
    """Raise ValueError naming the first part of ``report`` that is not what
    :func:`runs_to_dict` writes (an ``analysis.json`` handed over is checked before use)."""
    if not isinstance(report, dict) or not isinstance(report.get("runs"), list) or not report["runs"]:
        raise ValueError("it holds no list of runs")
    fields = {field.name: field.default is MISSING for field in dataclasses.fields(StackMeasurement)}
    stacks = None
    for i, run in enumerate(report["runs"]):
        where = f"runs[{i}]"
        if not isinstance(run, dict) or set(run) != {"label", "diverged_at", "train_loss", "measurements"}:
            raise ValueError(f"{where} is not an object with label, diverged_at, train_loss and measurements")
        if not isinstance(run["label"], str) or not run["label"]:
            raise ValueError(f"{where}.label is not a name")
        if run["diverged_at"] is not None and not _is_count(run["diverged_at"]):
            raise ValueError(f"{where}.diverged_at is not an update number")
        _check_numbers(run["train_loss"], f"{where}.train_loss")
        run_has_dual = None
        if not isinstance(run["measurements"], list) or not run["measurements"]:
            raise ValueError(f"{where}.measurements is not a list of measurements")
        for j, measurement in enumerate(run["measurements"]):
            at = f"{where}.measurements[{j}]"
            if not isinstance(measurement, dict) or not set(measurement) - MEASUREMENT_FIELDS <= set(STACKS):
                raise ValueError(f"{at} is not an object with step, loss and {' or '.join(STACKS)}")
            if not _is_count(measurement.get("step")) or not _is_number(measurement.get("loss")):
                raise ValueError(f"{at} has no update number (step) or no loss")
            # (absent from reports written before it was measured)
            if measurement.get("loss_other_source") is not None and not _is_number(measurement["loss_other_source"]):
                raise ValueError(f"{at}.loss_other_source is not a number")
            measured = tuple(name for name in STACKS if name in measurement)
            if not measured or measured != (stacks or measured):
                raise ValueError(f"{at} measures {', '.join(measured) or 'no stack'}, the runs before it "
                                 f"{', '.join(stacks)}")
            stacks = measured
            for name in measured:
                values = measurement[name]
                if not isinstance(values, dict) or not set(values) <= set(fields):
                    raise ValueError(f"{at}.{name} is not an object of {', '.join(fields)}")
                for field, required in fields.items():
                    if required or values.get(field) is not None:
                        _check_numbers(values.get(field), f"{at}.{name}.{field}")
                _check_layer_counts(values, f"{at}.{name}")
                # The figures draw a run's dual stream from every measurement once its first has one.
                has_dual = {values.get(field) is not None for field in DUAL_FIELDS}
                if len(has_dual) > 1 or has_dual != (run_has_dual or has_dual):
                    raise ValueError(f"{at}.{name} has {', '.join(DUAL_FIELDS)} unlike the rest of its run")
                run_has_dual = has_dual


# ResiDual's dual stream: measured on every stack of a ResiDual run, and on no other run.
DUAL_FIELDS = ("dual_norm", "dual_max_abs", "dual_cos_next")


def _check_layer_counts(values: Dict, where: str) -> None:
    """One number per layer (``*_next``: per pair of adjacent layers), as probe.measure gives them."""
    layers = len(values["param_grad_norm"])
    if not layers:
        raise ValueError(f"{where}.param_grad_norm is empty")
    for field, numbers in values.items():
        expected = layers - 1 if field.endswith("_next") else layers
        if numbers is not None and len(numbers) != expected:
            raise ValueError(f"{where}.{field} has {len(numbers)} numbers for {layers} layers (expected {expected})")


def runs_from_dict(report: Dict) -> List[Run]:
    """The inverse of :func:`runs_to_dict`: runs back from an ``analysis.json`` (ValueError
    when it is not one, see :func:`check_report`)."""
    check_report(report)
    runs = []
    for r in report["runs"]:
        run = Run(label=r["label"], train_loss=r["train_loss"], diverged_at=r["diverged_at"])
        for m in r["measurements"]:
            run.steps.append(m["step"])
            run.measurements.append(Measurement(
                loss=m["loss"], stacks={name: StackMeasurement(**m[name]) for name in STACKS if name in m},
                loss_other_source=m.get("loss_other_source")))
        runs.append(run)
    return runs


def write_tables(runs: List[Run], settings: Dict, out_dir: Path) -> None:
    with open(out_dir / "analysis.json", "w") as f:
        json.dump(runs_to_dict(runs, settings), f, indent=1)
    for filename, columns in TABLES.items():
        with open(out_dir / filename, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["run", "step", "stack", "layer", *columns])
            for run in runs:
                for step, m in zip(run.steps, run.measurements):
                    for name, stack in m.stacks.items():
                        values = [getattr(stack, c) for c in columns]
                        if all(v is None for v in values):
                            continue
                        for layer in range(len(stack.param_grad_norm)):
                            row = [v[layer] if v is not None and layer < len(v) else "" for v in values]
                            writer.writerow([run.label, step, name, layer + 1, *row])
    with open(out_dir / "loss.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "step", "loss", "loss_other_source", "source_gain"])
        for run in runs:
            for step, m in zip(run.steps, run.measurements):
                writer.writerow([run.label, step, m.loss, *("" if value is None else value
                                                            for value in (m.loss_other_source, m.source_gain))])
    with open(out_dir / "training.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "update", "train_loss"])
        for run in runs:
            for update, loss in enumerate(run.train_loss, start=1):
                writer.writerow([run.label, update, loss])


def _style(label):
    return {"color": COLORS.get(label), "label": LABELS.get(label, label), "marker": ".", "linewidth": 1.5}


def _at_step(run: Run, step: int):
    """The run's measurement at ``step``, or its last one if it stopped before."""
    for s, m in zip(run.steps, run.measurements):
        if s == step:
            return m
    return run.measurements[-1]


def _grid(rows, title, stacks=STACKS):
    fig, axes = plt.subplots(len(rows), len(stacks), figsize=(11, 3.3 * len(rows)), squeeze=False)
    fig.suptitle(title)
    for r, (field_name, ylabel, logscale) in enumerate(rows):
        for c, stack in enumerate(stacks):
            ax = axes[r][c]
            ax.set_title(f"{stack}: {ylabel}", fontsize=10)
            ax.set_xlabel("layer (1 = lowest)")
            if logscale:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
    return fig, axes


def _plot_grid(runs, step, rows, title, path):
    stacks = _stacks(runs)
    fig, axes = _grid(rows, title, stacks)
    for r, (field_name, _, _) in enumerate(rows):
        for c, stack in enumerate(stacks):
            for run in runs:
                values = getattr(_at_step(run, step).stacks[stack], field_name)
                if values is None:
                    continue
                # cos_next/cka_next compare layer i with i+1: plot them at i+1.
                first = 2 if field_name.endswith("_next") else 1
                axes[r][c].plot(range(first, first + len(values)), values, **_style(run.label))
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gradients(runs, step, path):
    _plot_grid(runs, step, [
        ("param_grad_norm", "grad norm of the layer's parameters", True),
        ("input_grad_norm", "grad norm w.r.t. the layer's input", True),
    ], f"Gradient norm per layer (update {step})", path)


def plot_similarity(runs, step, path):
    _plot_grid(runs, step, [
        ("cos_next", "cosine(layer i-1, layer i)", False),
        ("cos_last", "cosine(layer i, top layer)", False),
        ("cka_next", "linear CKA(layer i-1, layer i)", False),
    ], f"Similarity of layer outputs (update {step}; mean over non-pad tokens)", path)


def plot_dual_stream(runs, path):
    """ResiDual's d per layer at each measured update, against fp16's largest value."""
    stacks = _stacks(runs)
    dual_runs = [run for run in runs if run.measurements[0].stacks[stacks[0]].dual_norm is not None]
    if not dual_runs:
        return False
    fig, axes = plt.subplots(1, len(stacks), figsize=(11, 3.6), squeeze=False)
    for c, stack in enumerate(stacks):
        ax = axes[0][c]
        for run in dual_runs:
            for k, (step, m) in enumerate(zip(run.steps, run.measurements)):
                s = m.stacks[stack]
                shade = 0.35 + 0.65 * (k + 1) / len(run.steps)
                layers = range(1, len(s.dual_max_abs) + 1)
                # Later updates darker; only the first and last go into the legend.
                named = k in (0, len(run.steps) - 1)
                ax.plot(layers, s.dual_max_abs, color="tab:green", alpha=shade,
                        label=f"{run.label} largest |d| entry, update {step}" if named else None)
                ax.plot(layers, s.dual_norm, color="tab:olive", alpha=shade, linestyle="--",
                        label=f"{run.label} mean token norm ||d||, update {step}" if named else None)
        ax.axhline(FP16_MAX, color="k", linestyle=":", label="fp16 max")
        ax.set_yscale("log")
        ax.set_title(f"{stack}: ResiDual dual stream d after each layer", fontsize=10)
        ax.set_xlabel("layer (1 = lowest)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_training(runs, path):
    """Loss per update and how the lowest layer's gradient compares with the top's."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for run in runs:
        style = _style(run.label)
        style.pop("marker")
        axes[0].plot(range(1, len(run.train_loss) + 1), run.train_loss, **style)
        for ax, stack in zip(axes[1:], _stacks(runs)):
            # A top layer's gradient of 0 gives inf (not drawn on the log scale); float division would raise.
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = [np.divide(m.stacks[stack].param_grad_norm[0], m.stacks[stack].param_grad_norm[-1])
                          for m in run.measurements]
            ax.plot(run.steps, ratios, marker=".", **style)
    axes[0].set_title("training loss (base 2)")
    axes[0].set_xlabel("update")
    for ax, stack in zip(axes[1:], _stacks(runs)):
        ax.set_title(f"{stack}: grad norm lowest layer / top layer", fontsize=10)
        ax.set_xlabel("update")
        ax.set_yscale("log")
        ax.axhline(1.0, color="k", linewidth=0.8)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_figures(runs: List[Run], out_dir: Path) -> List[str]:
    steps = sorted({0, *(run.steps[-1] for run in runs)})
    written = []
    for step in steps:
        plot_gradients(runs, step, out_dir / f"gradient_norms_update{step}.png")
        plot_similarity(runs, step, out_dir / f"similarity_update{step}.png")
        written += [f"gradient_norms_update{step}.png", f"similarity_update{step}.png"]
    if plot_dual_stream(runs, out_dir / "dual_stream.png"):
        written.append("dual_stream.png")
    if any(run.train_loss for run in runs):
        plot_training(runs, out_dir / "training.png")
        written.append("training.png")
    return written
