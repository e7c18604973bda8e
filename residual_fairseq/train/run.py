"""Running a training plan: the save dir's checks and record, then fairseq-train's processes.

:func:`train` is the whole run: plan, print, refuse a save dir that cannot be written
safely, lock it (:func:`~residual_fairseq.supervise.save_dir_lock`), find where fairseq
resumes, write ``SAVE_DIR/run.json`` (:mod:`residual_fairseq.run_record`), profile
Admin's omegas when needed, and :func:`execute` the commands under the driver's
supervision (:mod:`residual_fairseq.supervise`).
"""
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from .. import early_stopping
from ..errors import UserError
from ..run_record import RUN_RECORD_NAME
from ..run_record import write_run_record as write_record
from ..runtime import thread_environment
from ..supervise import (
    LOCK_NAME, STOP_GRACE_SECONDS, die_with_the_driver, forwarding_stop_signals, kill_groups, save_dir_lock,
)
from ..variants import needs_profile
from .plan import TrainPlan, TrainRequest, admin_profile_path, effective_model, plan, run_name
from .progress import LOG_NAME, ProgressDisplay, copy_output
from .resume import refuse_resuming_another_model, resume_point, resumed_early_stopping


def train(request: TrainRequest, dry_run: bool = False) -> TrainPlan:
    """Plan, print and (unless ``dry_run``) run one training; UserError if fairseq fails."""
    train_plan = plan(request)
    for note in train_plan.notes:
        print(f"note: {note}", flush=True)
    print(("would run" if dry_run else "running") + ":\n" + train_plan.describe(), flush=True)
    if dry_run:
        return train_plan
    refuse_links_in_save_dir(request.save_dir)
    refuse_resuming_another_model(request, train_plan)
    with save_dir_lock(request.save_dir) as lock_fd:
        point = resume_point(request.save_dir)
        environment = {}
        if point:
            print(f"note: {point[0]}", flush=True)
            patience_left, environment = resumed_early_stopping(train_plan, Path(request.save_dir), point[1],
                                                                request.extra_args)
            if patience_left == 0:  # fairseq would validate once more, and might move checkpoint_best.pt
                print("note: this run has already stopped early (--patience): nothing to train", flush=True)
                return train_plan
        write_run_record(request, train_plan)
        if needs_profile(request.variant):
            ensure_admin_profile(request, train_plan)
        returncode = execute(train_plan, Path(request.save_dir), lock_fd, request.progress, request.extra_args,
                             environment)
    if returncode != 0:
        raise UserError(f"fairseq-train exited {returncode} (log: {Path(request.save_dir) / LOG_NAME})")
    return train_plan


def refuse_links_in_save_dir(save_dir) -> None:
    """Refuse a save dir where a file the run writes is a symbolic link: the driver and fairseq
    open those names for writing (the lock, train.log, run.json, checkpoints, Admin's profile)
    and would write through a planted link into whatever it points at."""
    from ..admin_profile import PROFILE_NAME

    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return
    # (.run.json.tmp: the name run.json was written through before run_record's atomic writes)
    written = {LOCK_NAME, LOG_NAME, RUN_RECORD_NAME, f".{RUN_RECORD_NAME}.tmp", PROFILE_NAME}
    for path in sorted(save_dir.iterdir()):
        if path.is_symlink() and (path.name in written or
                                  (path.name.startswith("checkpoint") and path.name.endswith(".pt"))):
            raise UserError(f"{path} is a symbolic link: training writes that file and would write through the "
                            "link; remove it, or choose another --save-dir")


def ensure_admin_profile(request: TrainRequest, train_plan: TrainPlan) -> None:
    """Admin's first step: profile the omegas into SAVE_DIR, unless already there or resuming."""
    from ..admin_profile import profile_for_training

    path = admin_profile_path(request.save_dir)
    if path.is_file() or (Path(request.save_dir) / "checkpoint_last.pt").is_file():
        return
    command = list(train_plan.commands[0][1:])
    index = command.index("--admin-profile")
    del command[index:index + 2]
    print(f"profiling Admin's omegas on the first training batch -> {path}", flush=True)
    profile_for_training(command, path)


def write_run_record(request: TrainRequest, train_plan: TrainPlan) -> Path:
    """``SAVE_DIR/run.json``: which config trained this directory, and how."""
    task = train_plan.settings["task"]
    model = train_plan.model or effective_model(train_plan.settings, request.extra_args)
    return write_record(request.save_dir, {
        "name": run_name(request.variant, model),
        "dataset": request.dataset, "variant": request.variant,
        # "layers": the encoder depth, as before (fine-tuning reads it); the real sizes are in "model".
        "layers": model.get("encoder_layers", request.layers),
        "encoder_layers": model.get("encoder_layers"), "decoder_layers": model.get("decoder_layers"),
        "model": model, "source_lang": task.get("source_lang"), "target_lang": task.get("target_lang"),
        "seed": train_plan.settings["common"].get("seed"), "data": str(Path(request.data).resolve()),
        "threads": train_plan.threads,
        "extra_args": list(request.extra_args), "commands": [shlex.join(c) for c in train_plan.commands],
    })


def execute(train_plan: TrainPlan, save_dir: Path, lock_fd: Optional[int] = None, progress: Optional[bool] = None,
            extra_args=(), environment=None) -> int:
    """Run the plan's processes (all at once) and return the first non-zero status, else 0.

    Rank 0's output goes to the console and ``SAVE_DIR/train.log``; rank R's to
    ``SAVE_DIR/train.rankR.log``. ``progress`` (default: stdout is a terminal) shows a
    progress bar on the console instead of rank 0's log lines. Each process runs in its own process group and dies
    with the driver: SIGTERM/SIGINT are forwarded to the groups (the driver then ends
    by the same signal), and a driver killed outright takes them with it
    (``PR_SET_PDEATHSIG``). ``lock_fd`` (the save dir's lock) is inherited by the children;
    ``environment`` adds variables to theirs.
    """
    if progress is None:
        progress = sys.stdout.isatty()
    display = None
    if progress:
        display = ProgressDisplay(train_plan.number("optimization", "max_update", extra_args),
                                  train_plan.number("optimization", "max_epoch", extra_args))
        display.write(f"progress bar below; fairseq's full log: {save_dir / LOG_NAME}")
    env = thread_environment(train_plan.threads)
    env.pop(early_stopping.ENVIRONMENT_VARIABLE, None)  # only this resume's count, never an inherited one
    env.update(environment or {})
    processes, copiers, failed = [], [], []
    with forwarding_stop_signals(processes) as received:
        try:
            for command in train_plan.commands:
                processes.append(subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                    start_new_session=True, preexec_fn=die_with_the_driver(),
                    pass_fds=() if lock_fd is None else (lock_fd,), env=env,
                ))
            # Threads start after the forks: preexec_fn is only safe without other threads.
            for rank, process in enumerate(processes):
                log_path = save_dir / (LOG_NAME if rank == 0 else f"train.rank{rank}.log")
                copier = threading.Thread(target=copy_output, args=(process, log_path, rank == 0,
                                                                     display if rank == 0 else None), daemon=True)
                copier.start()
                copiers.append(copier)
            stop_deadline = None
            while True:
                codes = [process.poll() for process in processes]
                failed = [code for code in codes if code not in (None, 0)]
                if all(code is not None for code in codes) or (failed and not received):
                    break
                if received and stop_deadline is None:
                    stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    kill_groups(processes, signal.SIGKILL)
                time.sleep(0.2)
        except FileNotFoundError as err:
            raise UserError(f"{err.filename} not found: is fairseq installed in this environment?") from None
        finally:
            # One failed rank leaves the others waiting forever on a collective.
            kill_groups(processes, signal.SIGTERM)
            for process in processes:
                process.wait()
            for copier in copiers:
                copier.join(timeout=10)
            if display is not None:
                display.close()
    if received:
        signal.raise_signal(received[0])  # die as the signal asked (SIGINT: KeyboardInterrupt)
    return failed[0] if failed else 0


