"""Training finished runs on to a larger budget: ``residual-fairseq-reproduce --extend``.

A run that its epoch/update budget ended (not patience) may still have been improving. Rerun
the matrix into the same ``--out`` with the same flags after ``--`` except a larger
``--max-epoch`` and/or ``--max-update``, and ``--extend``:

- a run finished here that the budget ended resumes from its ``checkpoint_last.pt``
  (fairseq's own resume; the driver carries patience over) and is evaluated again; its
  earlier result files (``result.json`` and its sidecars) are moved, never deleted, into
  ``SAVE_DIR/before-extend/epoch<E>/``;
- a run finished here that patience ended would have ended the same under the larger
  budget: it stays finished as it is;
- runs finished elsewhere (``--finished-runs``) have no checkpoints here: tabulated as given.

Without ``--extend``, a finished run recorded with a smaller budget is refused, naming
``--extend``. A smaller budget, or any other flag changed, is never an extension
(reproduce.cli.finished_runs_to_extend refuses it like any other change of flags).
"""
import math
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

from .. import configs
from ..errors import UserError
from ..passthrough import flag_value, without_flags
from .runs import RESULT_NAME, Run

BUDGET_FLAGS = ("--max-epoch", "--max-update")
ASIDE_DIR = "before-extend"


def budget(extra_args, settings: dict) -> Optional[dict]:
    """{flag: limit} of ``extra_args`` over the config's ``optimization`` ``settings`` (0: no limit, as
    fairseq reads it: inf); None when a value is not a whole number >= 0."""
    limits = {}
    for flag in BUDGET_FLAGS:
        given = flag_value(extra_args, flag)
        value = settings.get(flag[2:].replace("-", "_"), 0) if given is None else given
        try:
            number = int(str(value))
        except ValueError:
            return None
        if number < 0:
            return None
        limits[flag] = math.inf if number == 0 else number
    return limits


def larger_budget(recorded, asked, run: Run) -> Optional[Tuple[dict, dict]]:
    """(the recorded limits, the asked ones) when ``asked`` differs from ``recorded`` only in a budget
    that is nowhere smaller and somewhere larger; else None."""
    if without_flags(recorded, BUDGET_FLAGS) != without_flags(asked, BUDGET_FLAGS):
        return None
    settings = configs.load(run.dataset, run.variant, run.layers).get("optimization", {})
    old, new = budget(recorded, settings), budget(asked, settings)
    if (old is None or new is None or not all(new[flag] >= old[flag] for flag in BUDGET_FLAGS)
            or not any(new[flag] > old[flag] for flag in BUDGET_FLAGS)):
        return None
    return old, new


def trains_on(run: Run, old: dict, new: dict, extend: bool) -> bool:
    """For a run finished here with the smaller budget ``old`` than the command's ``new``: True when
    --extend trains it on (the budget ended it), False when it stays finished (patience ended it).
    Without ``extend`` a UserError naming --extend; so is a run whose train.log does not say how it
    ended, one with no checkpoint_last.pt to resume from, and one whose reached limit stays."""
    if not extend:
        raise UserError(f"{run.label} finished in {run.save_dir} with a smaller budget than this command's: add "
                        f"--extend to train it on to the larger budget, or give the same flags, or another --out")
    ended = run.ended_by()
    if ended is not None and ended.startswith("patience"):
        return False
    if ended != "budget":
        raise UserError(f"--extend: {run.label}'s train.log does not say whether patience or its budget ended "
                        f"it, so whether a larger budget trains it on cannot be told")
    if not (run.save_dir / "checkpoint_last.pt").is_file():
        raise UserError(f"--extend: {run.label} has no checkpoint_last.pt in {run.save_dir} to resume from")
    refuse_unraised_limit(run, old, new)
    return True


def refuse_unraised_limit(run: Run, old: dict, new: dict) -> None:
    """UserError when the limit the run reached (its last validation's epoch or updates) is not
    raised: fairseq would stop again at once, and the run would only be evaluated again."""
    last = (run.curve() or [{}])[-1]
    reached = {"--max-epoch": last.get("epoch"), "--max-update": last.get("updates")}
    for flag in BUDGET_FLAGS:
        if isinstance(reached[flag], int) and reached[flag] >= old[flag] and new[flag] == old[flag]:
            raise UserError(f"--extend: {run.label} stopped at its {flag} {old[flag]}, which this command does "
                            f"not raise: raise {flag} too")


def aside_dir(run: Run) -> Path:
    curve = run.curve()
    return run.save_dir / ASIDE_DIR / f"epoch{curve[-1]['epoch'] if curve else 0}"


def result_files(run: Run) -> List[Path]:
    """The files evaluation wrote beside result.json (``result.*``), then result.json itself: moved
    last, so that a move cut short leaves the run finished and the next --extend completes it."""
    stem = Path(RESULT_NAME).stem
    sidecars = sorted(path for path in run.save_dir.iterdir()
                      if path.is_file() and path.name.startswith(stem + ".") and path.name != RESULT_NAME)
    return sidecars + [run.result_path]


def set_aside(runs: List[Run], dry_run: bool) -> None:
    """Move each run's result files into aside_dir (the run is then unfinished and trains on)."""
    for run in runs:
        target = aside_dir(run)
        if dry_run:
            print(f"would extend {run.label}: move its result files to {target}, resume from checkpoint_last.pt, "
                  f"evaluate again", flush=True)
            continue
        files = result_files(run)
        taken = next((target / path.name for path in files if (target / path.name).exists()), None)
        if taken is not None:
            raise UserError(f"--extend: {taken} exists already: move it away first")
        target.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.move(str(path), str(target / path.name))
        print(f"extend {run.label}: its earlier results are in {target}", flush=True)
