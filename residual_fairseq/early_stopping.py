"""Early stopping (``--patience``) that survives a resume.

fairseq counts the validations since the best one in attributes of the function
``fairseq_cli.train.should_stop_early``, which a new process starts empty: a resumed
run forgets both its best validation score and how long ago it was, takes its first
validation after the resume as a new best, and so trains up to ``patience`` more
validations than the same run uninterrupted. Runs of the reproduce matrix take many
hours and are resumed often, so where they stop would depend on when they were
interrupted.

The train driver rebuilds the count before it resumes (:func:`resumed_state`):
the best score is the one fairseq stores in ``checkpoint_last.pt``; the validations
since it are those in the run's log after the updates of ``checkpoint_best.pt``. It
hands them to its fairseq-train processes in an environment variable, which the
plugin applies when fairseq-train imports it (:func:`restore_in_fairseq_train`).
Any doubt (no best checkpoint, a log without the best validation, reset flags)
leaves fairseq's own behaviour, and the driver says so.

A tie with the best score counts as an improvement for ``checkpoint_best.pt`` but
not for patience; losses rarely tie exactly, and such a run stops one validation late.
"""
import json
import logging
import math
import os
from pathlib import Path
from typing import Optional, Tuple

from .training_log import validation_curve

ENVIRONMENT_VARIABLE = "RESIDUAL_FAIRSEQ_EARLY_STOPPING"
logger = logging.getLogger(__name__)


def _updates(state: dict) -> Optional[int]:
    history = state.get("optimizer_history") or [{}]
    updates = history[-1].get("num_updates") if isinstance(history[-1], dict) else None
    return updates if isinstance(updates, int) else None


def resumed_state(save_dir, log_path, subset: str = "valid") -> Tuple[Optional[dict], str]:
    """(``{"best": score, "runs": validations since it}`` or None, a line saying which).

    Reads ``SAVE_DIR/checkpoint_last.pt`` and ``checkpoint_best.pt`` (checked, as every
    checkpoint) and the validations on ``subset`` in ``log_path``.
    """
    from .safe_checkpoints import read_checkpoint

    save_dir = Path(save_dir)
    restart = "patience restarts from this resume (fairseq's behaviour)"
    best_path = save_dir / "checkpoint_best.pt"
    if not best_path.is_file():
        return None, f"no {best_path.name}: {restart}"
    last = read_checkpoint(save_dir / "checkpoint_last.pt")
    best_score = (last.get("extra_state") or {}).get("best")
    last_updates = _updates(last)
    best_updates = _updates(read_checkpoint(best_path))
    if not isinstance(best_score, (int, float)) or not math.isfinite(best_score) \
            or last_updates is None or best_updates is None or best_updates > last_updates:
        return None, f"the checkpoints do not say where the best validation was: {restart}"
    validated_at = {point["updates"] for point in validation_curve(log_path, subset)}
    if best_updates not in validated_at:
        return None, f"{Path(log_path).name} lacks the best validation (update {best_updates}): {restart}"
    runs = len({updates for updates in validated_at if best_updates < updates <= last_updates})
    return ({"best": float(best_score), "runs": runs},
            f"patience continues: best validation {best_score:.4g} at update {best_updates}, "
            f"{runs} validation(s) since")


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
    except (ValueError, TypeError, KeyError):
        logger.warning("ignoring %s=%r: not what the train driver writes", ENVIRONMENT_VARIABLE, value)
        return False
    # fairseq-train has imported this module before the plugin; under torch's spawn a
    # child imports it to find its main(), so every rank counts the same.
    import fairseq_cli.train

    fairseq_cli.train.should_stop_early.best = best
    fairseq_cli.train.should_stop_early.num_runs = runs
    return True
