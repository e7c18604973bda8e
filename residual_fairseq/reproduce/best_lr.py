"""Each variant at its own best learning rate: per row, the rate whose seed-1 run has the lowest validation loss.

The protocol of docs/results/fair-comparison.md: the same reproduce matrix run once per
learning rate (an ``--out`` each); per (dataset, variant, layers), the rate whose
``--selection-seed`` run has the lowest best validation loss is chosen (never the test set), a
tie going to the smaller rate. A row is chosen only when every rate has that run finished, else
it is incomplete, naming the rates it lacks; a run that did not learn is compared by its loss
like any other, and named. A choice is *budget-limited* where a rate it beat was ended by the
epoch/update budget rather than by patience: that run may still have been improving, so a longer
budget could change the choice (the chosen run's own budget can only lower its loss).
``--check-epochs K`` ranks the rates again by each run's lowest loss of epochs 1-K and says
whether that agrees with the full runs (a shortened selection is allowed only where it does); a run
that patience did not end with fewer than K validations there (a shorter budget), or none after
epoch K (a shortened run: nothing to check), makes it "cannot tell". Writes
selection.md/.json (the losses, choices, checks, and the reproduce flags for the other seeds at
each chosen rate) and report.write_reports of the chosen rate's runs, a column naming the rate.

CLI::

    residual-fairseq-best-lr --matrix 1e-3=results/fair/lr-1e-3 --matrix 2e-3=results/fair/lr-2e-3 \\
        --matrix 5e-3=results/fair/lr-5e-3 --out results/fair/best-lr [--check-epochs 8]

Every runs.json is read as hostile (records.read_finished_runs). Where a matrix's run
directories hold a run.json whose flags after ``--`` give ``--lr``, it must be the matrix's rate.
"""
import argparse
import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..argtypes import MAX_SEED, check_output_dir, int_at_least, positive_int, refuse_repeats, same_file
from ..atomic import write_text_atomically
from ..errors import UserError, cli_main
from ..passthrough import flag_value
from ..run_record import recorded_extra_args
from .records import best_validation, data_label, read_finished_runs
from .report import REPORT_NAMES, write_reports
from .runs import finished_run_keys, matrix, run_dir

OUTPUT_NAMES = ("selection.md", "selection.json") + REPORT_NAMES


@dataclass
class Matrix:
    given: str        # the rate as the user wrote it: how tables name it
    rate: float
    runs_json: Path
    records: dict     # read_finished_runs of runs_json

    def save_dir(self, key) -> Path:  # reproduce's layout around its runs.json
        return run_dir(self.runs_json.parent, *key)


def as_rate(text):
    """``text`` as a learning rate (a finite number > 0), or None."""
    try:
        rate = float(text)
    except (TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def matrix_flag(value: str):
    """``--matrix LR=PATH`` as (LR as given, LR, PATH)."""
    given, sep, path = value.partition("=")
    if not sep or not path:
        raise UserError(f"--matrix {value}: give LR=PATH (a learning rate, a reproduce --out or its runs.json)")
    if as_rate(given) is None:
        raise UserError(f"--matrix {value}: the learning rate must be a finite number above 0, not {given!r}")
    return given, as_rate(given), Path(path)


def read_matrices(values) -> list:
    """The --matrix values read and checked, by rate from the smallest."""
    matrices = []
    for given, rate, path in map(matrix_flag, values):
        runs_json = path / "runs.json" if path.is_dir() else path
        if not path.exists():
            raise UserError(f"--matrix {given}={path}: no such file or directory")
        if not runs_json.exists():
            raise UserError(f"--matrix {given}={path} holds no runs.json: give a residual-fairseq-reproduce --out "
                            f"that has tabulated its runs, or a runs.json")
        for other in matrices:
            if other.rate == rate:
                raise UserError(f"--matrix {given} and --matrix {other.given} are the same learning rate: "
                                "give each once")
            if same_file(other.runs_json, runs_json):
                raise UserError(f"--matrix {given}={path} is the runs.json of --matrix {other.given} too: "
                                f"give each matrix once")
        matrices.append(Matrix(given, rate, runs_json, read_finished_runs([runs_json], f"--matrix {given} file")))
        refuse_other_rate(matrices[-1])
    return sorted(matrices, key=lambda m: m.rate)


def untabulated(m: Matrix) -> list:
    """The runs finished in ``m``'s directory (reproduce's layout: a result.json) that its runs.json
    lacks: a later reproduce command over a part of the matrix (one row's other seeds...) rewrote
    it with that part's runs only."""
    return sorted(key for key in finished_run_keys(m.runs_json.parent) if key not in m.records)


def refuse_other_rate(m: Matrix) -> None:
    """UserError naming a run of ``m`` whose run.json says it trained at another rate: a
    mislabelled matrix would silently swap two rates' numbers."""
    for key in m.records:
        extra = recorded_extra_args(m.save_dir(key))
        lr = flag_value(extra, "--lr") if extra is not None else None
        if lr is not None and as_rate(lr) != m.rate:
            dataset, variant, layers, seed = key
            raise UserError(f"--matrix {m.given}={m.runs_json}: {dataset} {variant} {layers}L seed {seed} was "
                            f"trained with --lr {lr} ({m.save_dir(key) / 'run.json'}), not {m.given}: give each "
                            f"matrix its rate")


def refuse_out_over_inputs(out: Path, matrices) -> None:
    for m in matrices:
        if same_file(out, m.runs_json.parent) or any(same_file(out / name, m.runs_json) for name in OUTPUT_NAMES):
            raise UserError(f"--out {out} is where --matrix {m.given}'s runs.json is, which the tables written there "
                            f"would replace: choose another --out")
    if (out / "runs").exists():  # Run objects would read a result.json there before the records
        raise UserError(f"--out {out} holds a reproduce matrix's runs/: choose another --out")


def best(validations):
    """(lowest loss, its epoch) of ``validations``, or None (records.best_validation: as runs.json)."""
    low = best_validation(validations)
    return (low["loss"], low["epoch"]) if low else None


def ranking(losses: dict, matrices) -> list:
    """The rates given in ``losses`` from the lowest loss; a tie goes to the smaller rate."""
    ranked = sorted((m for m in matrices if m.given in losses), key=lambda m: (losses[m.given], m.rate))
    return [m.given for m in ranked]


def select(matrices, seed: int, check_epochs=None) -> list:
    """A row per (dataset, variant, layers) of any matrix: each rate's seed-``seed`` run, the choice, the check."""
    keys = dict.fromkeys(key[:3] for m in matrices for key in m.records)
    rows = []
    for dataset, variant, layers in keys:
        found = {m.given: m.records.get((dataset, variant, layers, seed), (None, None))[0] for m in matrices}
        runs = {given: {"best_valid_loss": low[0], "best_epoch": low[1], "status": record["status"],
                        "ended_by": record.get("ended_by")}
                for given, record in found.items() if record and (low := best(record["validations"]))}
        # The data each matrix trained this row on (an older record names none: the config's own).
        names = {record.get("data") or dataset for m in matrices for key, (record, _) in m.records.items()
                 if key[:3] == (dataset, variant, layers)}
        if len(names) > 1:  # one config, several corpora: their losses are not comparable
            raise UserError(f"{dataset} {variant} {layers}L was trained on different data in the matrices ("
                            + ", ".join(sorted(map(str, names))) + "): give matrices of one corpus")
        data = next(iter(names))
        row = {"dataset": dataset, "data": data_label(dataset, data), "variant": variant, "layers": layers,
               "runs": runs, "missing": [m.given for m in matrices if m.given not in runs],
               "chosen": None, "ranking": None, "check": None, "budget_limited": []}
        if not row["missing"]:
            row["ranking"] = ranking({given: run["best_valid_loss"] for given, run in runs.items()}, matrices)
            row["chosen"] = row["ranking"][0]
            row["budget_limited"] = [given for given in row["ranking"][1:] if runs[given]["ended_by"] == "budget"]
            if check_epochs:
                row["check"] = check(found, row["ranking"], check_epochs, matrices)
        rows.append(row)
    return rows


def check(found: dict, full: list, epochs: int, matrices) -> dict:
    """Whether the first ``epochs`` epochs rank the rates as the full runs (``full``) do."""
    early = {given: [p for p in record["validations"] if p["epoch"] <= epochs] for given, record in found.items()}
    # A run that patience ended within K epochs is whole: its first K epochs are all of it. Any other
    # run with fewer than K validations there was cut short, and one with no validation after epoch K
    # (a shortened selection run) ranks the same either way: the check would only repeat itself.
    for given in full:
        if str(found[given].get("ended_by")).startswith("patience"):
            continue
        if len(early[given]) < epochs:
            return {"verdict": "cannot tell", "why": f"{given} has {len(early[given])} validations in epochs 1-{epochs}"}
        if len(early[given]) == len(found[given]["validations"]):
            return {"verdict": "cannot tell", "why": f"{given} has no validation after epoch {epochs}"}
    order = ranking({given: best(points)[0] for given, points in early.items()}, matrices)
    verdict = "agrees" if order == full else "same choice, other order" if order[0] == full[0] else "disagrees"
    return {"verdict": verdict, "ranking": order}


def reproduce_command(row, m: Matrix, selection_seed: int, seeds) -> str:
    """The reproduce flags that run ``seeds`` of ``row`` into rate ``m``'s --out, with the flags after
    -- that its selection run recorded (run.json); ``-- FLAGS`` where the matrix's directory holds no
    run.json for it (a run tabulated from --finished-runs): the flags are then the reader's to give."""
    words = ["--dataset", row["dataset"], "--data", "DATA", "--variants", row["variant"],
             "--layers", str(row["layers"]), "--seeds", *map(str, seeds), "--out", str(m.runs_json.parent)]
    extra = recorded_extra_args(m.save_dir((row["dataset"], row["variant"], row["layers"], selection_seed)))
    known = extra is not None
    return "residual-fairseq-reproduce " + shlex.join(words + (["--", *extra] if known else [])) + (
        "" if known else " -- FLAGS")


def budget_note(row) -> str:
    limited = row.get("budget_limited")
    return f" (budget-limited: {', '.join(limited)} ended by the budget)" if limited else ""


def incomplete(row, seed: int) -> str:
    return f"no finished seed-{seed} run with validations at {', '.join(row['missing'])}"


def selection_markdown(rows, matrices, seed: int, check_epochs) -> str:
    rates = [m.given for m in matrices]
    lines = ["# Each variant at its own best learning rate\n",
             f"Per row, the rate whose seed-{seed} run has the lowest best validation loss (its epoch in brackets; "
             f"a run that did not learn is compared like any other; \"budget\": the epoch/update budget ended it, "
             f"not patience); a tie goes to the smaller rate. A choice is budget-limited where a rate it beat was "
             f"ended by the budget: that run may still have been improving. Rates: "
             + ", ".join(f"{m.given} ({m.runs_json})" for m in matrices) + "."
             + (f" First {check_epochs} epochs: the rates ranked by each run's lowest validation loss of epochs "
                f"1-{check_epochs}, against the full runs' ranking." if check_epochs else "") + "\n",
             "| dataset | variant | layers | " + " | ".join(rates) + " | chosen |"
             + (f" first {check_epochs} epochs |" if check_epochs else ""),
             "|" + "---|" * (4 + len(rates) + bool(check_epochs))]
    for row in rows:
        cells = [row["data"], row["variant"], str(row["layers"])]
        for given in rates:
            run = row["runs"].get(given)
            cells.append("-" if run is None else f"{run['best_valid_loss']:.3f} ({run['best_epoch']}"
                         + (", budget" if run.get("ended_by") == "budget" else "")
                         + (", did not learn)" if run["status"] == "finished, did not learn" else ")"))
        cells.append((row["chosen"] + budget_note(row)) if row["chosen"] else f"incomplete: {incomplete(row, seed)}")
        if check_epochs:
            verdict = row["check"] or {"verdict": "-"}
            cells.append(verdict["verdict"] + (f" ({verdict.get('why') or ' < '.join(verdict['ranking'])})"
                                               if row["check"] else ""))
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    commands = [f"- {row['data']} {row['variant']} {row['layers']}: `{row['reproduce']}`"
                for row in rows if row.get("reproduce")]
    if commands:
        lines += ["\nThe other seeds at each row's chosen rate (DATA: the matrix's --data; FLAGS, where shown: the "
                  "flags after -- the matrix was run with, which its directory does not record for that row's "
                  "seed-1 run):\n"] + commands
    return "\n".join(lines) + "\n"


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-best-lr",
        description="Choose each (dataset, variant, depth)'s learning rate by the lowest best validation loss "
                    "of its selection seed, over reproduce matrices run one per rate, and tabulate the chosen runs.")
    parser.add_argument("--matrix", action="append", default=[], required=True, metavar="LR=PATH",
                        help="a reproduce --out (or its runs.json) run at learning rate LR; twice or more")
    parser.add_argument("--out", required=True, help="selection.md/.json and the chosen runs' tables go here")
    parser.add_argument("--selection-seed", type=int_at_least(0, MAX_SEED), default=1,
                        help="the seed whose best validation loss chooses the rate (default: 1)")
    parser.add_argument("--seeds", nargs="+", action="extend", type=int_at_least(0, MAX_SEED),
                        help="the seeds the chosen rate's table is over (default: 1 2 3)")
    parser.add_argument("--check-epochs", type=positive_int, metavar="K",
                        help="also rank the rates by the first K epochs and say whether that agrees")
    return parser


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    out = check_output_dir(args.out, "--out")
    seeds = args.seeds or [1, 2, 3]
    refuse_repeats(seeds, "--seeds")
    if len(args.matrix) < 2:
        raise UserError("give --matrix LR=PATH for at least 2 learning rates: one rate has nothing to choose from")
    matrices = read_matrices(args.matrix)
    refuse_out_over_inputs(out, matrices)
    for m in matrices:
        missing = untabulated(m)
        if missing:
            print(f"note: --matrix {m.given}: {len(missing)} runs finished in {m.runs_json.parent} are not in its "
                  f"runs.json (e.g. {' '.join(map(str, missing[0]))}), left out here: a reproduce command writes the "
                  f"runs of its own matrix only; rewrite it over the whole matrix with residual-fairseq-reproduce "
                  f"... --seeds ... --out {m.runs_json.parent} --report-only", flush=True)
    rows = select(matrices, args.selection_seed, args.check_epochs)
    by_rate, runs = {m.given: m for m in matrices}, []
    other_seeds = [seed for seed in seeds if seed != args.selection_seed]
    for row in rows:
        chosen = by_rate.get(row["chosen"])
        key = (row["dataset"], row["variant"], row["layers"])
        row["reproduce"] = (reproduce_command(row, chosen, args.selection_seed, other_seeds)
                            if chosen and other_seeds else None)
        finished = [seed for seed in seeds if chosen and (*key, seed) in chosen.records]
        if finished:  # the chosen rate's runs only, from its records (the data directory is not read)
            runs += matrix({row["dataset"]: out / "data"}, out, [row["variant"]], [row["layers"]], finished,
                           chosen.records)
    text = selection_markdown(rows, matrices, args.selection_seed, args.check_epochs)
    write_text_atomically(out / "selection.md", text)
    summary = {"selection_seed": args.selection_seed, "seeds": seeds, "check_epochs": args.check_epochs,
               "matrices": [{"rate": m.rate, "given": m.given, "runs_json": str(m.runs_json)} for m in matrices],
               "rows": rows}
    write_text_atomically(out / "selection.json", json.dumps(summary, indent=1) + "\n")
    rates = {(row["dataset"], row["variant"], row["layers"]): row["chosen"] for row in rows if row["chosen"]}
    paths = write_reports(runs, out, ("learning rate", rates))
    for row in rows:
        print(f"{row['data']} {row['variant']} {row['layers']}L: "
              + (f"{row['chosen']} ({' < '.join(row['ranking'])}){budget_note(row)}" if row["chosen"]
                 else f"incomplete ({incomplete(row, args.selection_seed)})")
              + (f"; first {args.check_epochs} epochs: {row['check']['verdict']}" if row["check"] else ""))
    print(f"{len(rates)} of {len(rows)} rows chosen; wrote {out / 'selection.md'}, {out / 'selection.json'}, "
          + ", ".join(str(path) for path in paths.values()))
