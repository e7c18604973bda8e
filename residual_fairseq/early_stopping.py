"""Early stopping (``--patience``) that survives a resume.

fairseq counts the validations since the best one in attributes of the function
``fairseq_cli.train.should_stop_early``, which a new process starts empty: a resumed
run forgets both its best validation score and how long ago it was, takes its first
validation after the resume as a new best, and so trains up to ``patience`` more
validations than the same run uninterrupted. Runs of the reproduce matrix take many
hours and are resumed often, so where they stop would depend on when they were
interrupted.

The train driver rebuilds the count before it resumes (:func:`resumed_state`) by
replaying fairseq's own rule over the validations in the run's log, up to the updates
of ``checkpoint_last.pt``. The log holds the very numbers fairseq compared (fairseq
rounds a validation's metric before it logs or compares it), so ties, validations
without a save (``--validate-interval-updates``) and validations that a crash made a
resume repeat count as they did for fairseq. The driver hands the count to its
fairseq-train processes in an environment variable, which the plugin applies when
fairseq-train imports it (:func:`restore_in_fairseq_train`). A log that does not show
the run's start (deleted, or cut) leaves fairseq's own behaviour, and the driver says so.
"""
import json
import logging
import math
import os
from typing import Optional, Tuple

from .training_log import run_validations

ENVIRONMENT_VARIABLE = "RESIDUAL_FAIRSEQ_EARLY_STOPPING"
logger = logging.getLogger(__name__)


def replay(scores, maximize: bool = False) -> Optional[dict]:
    """fairseq's ``should_stop_early`` over ``scores`` in order: ``{"best", "runs"}`` (None for none)."""
    best, runs = None, 0
    for score in scores:
        if best is None or (score > best if maximize else score < best):
            best, runs = score, 0
        else:
            runs += 1
    return None if best is None else {"best": best, "runs": runs}


def resumed_state(log_path, last_updates: int, subset: str = "valid", metric: str = "loss",
                  maximize: bool = False) -> Tuple[Optional[dict], str]:
    """(``{"best": score, "runs": validations since it}`` or None, a line saying which) for
    a run resumed from a checkpoint at ``last_updates``, from its log."""
    restart = "patience restarts from this resume (fairseq's behaviour)"
    history, started = run_validations(log_path, subset, metric, up_to_updates=last_updates)
    if not started:
        return None, f"{os.path.basename(log_path)} does not show where this run started: {restart}"
    state = replay((score for _, score in history), maximize)
    if state is None:
        return None, f"no validation before update {last_updates} in {os.path.basename(log_path)}: {restart}"
    return state, (f"patience continues: best validation {subset}_{metric} {state['best']:g}, "
                   f"{state['runs']} validation(s) since")


def environment(state: Optional[dict]) -> dict:
    """The variables that hand ``state`` to fairseq-train (none for None)."""
    return {} if state is None else {ENVIRONMENT_VARIABLE: json.dumps(state)}


def restore_in_fairseq_train(environ=None) -> bool:
    """Give ``fairseq_cli.train.should_stop_early`` the state the driver handed over; say whether.

    Called when the plugin is imported. Without the variable nothing happens, so
    fairseq-train runs that the driver did not start, and every other program, keep
    fairseq's behaviour. A malformed value is logged and ignored.
    """
    value = (os.environ if environ is None else environ).get(ENVIRONMENT_VARIABLE)
    if not value:
        return False
    try:
        state = json.loads(value)
        best, runs = float(state["best"]), state["runs"]
        if not (math.isfinite(best) and isinstance(runs, int) and runs >= 0):
            raise ValueError(value)
    except (ValueError, TypeError, KeyError, OverflowError):  # OverflowError: float(10**400)
        logger.warning("ignoring %s=%r: not what the train driver writes", ENVIRONMENT_VARIABLE, value)
        return False
    # fairseq-train has imported this module before the plugin; under torch's spawn a
    # child imports it to find its main(), so every rank counts the same.
    import fairseq_cli.train

    fairseq_cli.train.should_stop_early.best = best
    fairseq_cli.train.should_stop_early.num_runs = runs
    return True
