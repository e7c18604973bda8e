"""Resuming a save dir: from which checkpoint, with how much patience left, as which model.

fairseq-train resumes from ``SAVE_DIR/checkpoint_last.pt`` by itself. Before it starts,
:func:`resume_point` checks that checkpoint (and replaces a truncated one),
:func:`resumed_early_stopping` carries ``--patience`` over the resume (fairseq would
restart its count), and :func:`refuse_resuming_another_model` refuses to resume the
checkpoints as another model than run.json records.
"""
from pathlib import Path
from typing import Optional

from .. import early_stopping
from ..errors import UserError
from ..passthrough import flag_value
from ..run_record import recorded_name
from ..checkpoints import read_checkpoint, repair_last_checkpoint
from .plan import TrainPlan, TrainRequest, effective_model, run_name
from .progress import LOG_NAME


def _progress(state: dict):
    """(epoch, updates) stored in a verified checkpoint state; each None when not stored as a number."""
    history = state.get("optimizer_history")
    last = history[-1] if isinstance(history, list) and history and isinstance(history[-1], dict) else {}
    extra = state.get("extra_state") if isinstance(state.get("extra_state"), dict) else {}
    iterator = extra.get("train_iterator") if isinstance(extra.get("train_iterator"), dict) else {}
    epoch, updates = iterator.get("epoch"), last.get("num_updates")
    return (epoch if isinstance(epoch, int) else None), (updates if isinstance(updates, int) else None)


def resume_point(save_dir) -> Optional[tuple]:
    """(a line saying where fairseq will resume, the updates of that checkpoint), or None
    for a new run. Checks the checkpoint and repairs a truncated one.

    fairseq resumes from ``SAVE_DIR/checkpoint_last.pt`` only. A truncated one is
    replaced by the newest valid checkpoint fairseq wrote for the run
    (:func:`~residual_fairseq.checkpoints.repair_last_checkpoint`: never averaged
    checkpoints or other files); any other problem is a one-line error.
    """
    last = Path(save_dir) / "checkpoint_last.pt"
    if not last.exists():
        return None
    repaired_from = repair_last_checkpoint(save_dir)
    epoch, updates = _progress(read_checkpoint(last))
    progress = f"epoch {'?' if epoch is None else epoch}, {'?' if updates is None else updates} updates"
    if repaired_from is not None:
        return (f"{last} was truncated (a crash while fairseq copied it); resuming from {repaired_from} "
                f"({progress}), copied to {last.name}"), updates
    return f"resuming from {last} ({progress})", updates


# fairseq does not restore its best score when these are given; nor is patience then carried on.
RESET_FLAGS = ("reset_optimizer", "reset_meters")


def resumed_early_stopping(train_plan: TrainPlan, save_dir: Path, last_updates, extra_args=()):
    """(the patience left, the environment that carries ``--patience`` over this resume);
    the patience left is None without ``--patience`` or when the count restarts
    (:mod:`residual_fairseq.early_stopping`)."""
    patience = train_plan.number("checkpoint", "patience", extra_args)
    if patience <= 0:
        return None, {}
    if any(train_plan.switched_on(key, extra_args) for key in RESET_FLAGS):
        print("note: --reset-optimizer/--reset-meters: patience restarts from this resume", flush=True)
        return None, {}
    if last_updates is None:
        print("note: checkpoint_last.pt does not say its updates: patience restarts from this resume", flush=True)
        return None, {}
    dataset, checkpoint = train_plan.settings.get("dataset", {}), train_plan.settings.get("checkpoint", {})
    valid = flag_value(extra_args, "--valid-subset") or dataset.get("valid_subset") or "valid"
    metric = flag_value(extra_args, "--best-checkpoint-metric") or checkpoint.get(
        "best_checkpoint_metric") or "loss"
    state, line = early_stopping.resumed_state(
        save_dir / LOG_NAME, last_updates, valid.split(",")[0], metric,
        maximize=train_plan.switched_on("maximize_best_checkpoint_metric", extra_args))
    print(f"note: {line}", flush=True)
    if state is None:
        return None, {}
    return max(0, patience - state["runs"]), early_stopping.environment(state)


def refuse_resuming_another_model(request: TrainRequest, train_plan: TrainPlan) -> None:
    """fairseq would resume SAVE_DIR's checkpoint_last.pt into the model asked for (and fail on
    the first mismatched weight), after run.json had been rewritten to describe the new model:
    refuse first, naming both, while run.json still describes the checkpoints."""
    save_dir = Path(request.save_dir)
    if not (save_dir / "checkpoint_last.pt").is_file():
        return
    stored = recorded_name(save_dir)  # none, or not ours: fairseq's own check on loading decides
    asked = run_name(request.variant, train_plan.model or effective_model(train_plan.settings, request.extra_args))
    if stored is not None and stored != asked:
        raise UserError(f"--save-dir {save_dir} holds checkpoints of a {stored[:80]!r} run (its run.json), and "
                        f"fairseq would resume them as {asked}: choose another --save-dir")


