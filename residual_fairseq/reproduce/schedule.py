"""Running a reproduce matrix: each run trained and evaluated in turn, or several at a time in driver processes."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from .. import supervise, train
from ..errors import UserError
# Imported now, not when the first run is evaluated hours later: a driver must run one
# version of the package throughout, even if it is updated meanwhile (mixing modules
# of two versions once killed a driver at its first evaluation).
from ..evaluate import check_generate_extra_args, evaluate_run
from ..language_models import check_eval_lm_extra_args, eval_lm_command, evaluate_lm
from ..passthrough import refuse_flags
from ..atomic import write_text_atomically
from ..runtime import available_cores
from .records import is_language_model
from .report import write_reports
from .runs import Run, checkpoint_to_evaluate, evaluation_options, language_model_evaluation_options, train_request


def run_one(run: Run, nprocs: int = 1, extra_args=(), eval_overrides=None, dry_run: bool = False,
            threads=None) -> Optional[dict]:
    """Train (or resume) and evaluate one run; returns its result (None in a dry run).

    ``eval_overrides`` are evaluate_run keyword arguments that win over the dataset's.
    """
    if run.finished:
        print(f"skip {run.label}: finished ({run.finished_where})", flush=True)
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
    return evaluate_run(checkpoint_to_evaluate(run), run.data, out_json=run.result_path, threads=threads,
                        **options)



def evaluate_language_model(run: Run, eval_overrides=None, dry_run: bool = False, threads=None) -> Optional[dict]:
    """Test perplexity with fairseq-eval-lm and the dataset's context-window settings."""
    options = language_model_evaluation_options(run.dataset, eval_overrides)
    if dry_run:
        checkpoint = run.save_dir / "checkpoint_best.pt"
        print("would evaluate: " + shlex.join(eval_lm_command(checkpoint, run.data, **options)), flush=True)
        return None
    return evaluate_lm(checkpoint_to_evaluate(run), run.data, out_json=run.result_path, threads=threads, **options)


def reproduce(runs: List[Run], out: Path, nprocs: int = 1, extra_args=(), eval_overrides=None,
              dry_run: bool = False, threads=None, jobs: int = 1, verbose: bool = False, report: bool = True):
    """Run (or skip) every run, then write the reports; returns the report paths (None if dry).

    ``jobs`` > 1 runs that many at a time, each in its own driver process
    (:func:`run_in_parallel`). A run that fails (its training or evaluation raised a
    UserError) is recorded in its ``failed.json`` and reported in the table; the other
    runs go on. Raises UserError at the end when any run failed. ``report`` False skips
    the tables (a driver started by :func:`run_in_parallel`: its parent writes them).
    """
    # Before anything trains: flags after -- and evaluation overrides that cannot be honoured.
    check_passthrough(extra_args)
    overrides = eval_overrides or {}
    datasets = list(dict.fromkeys(run.dataset for run in runs))
    check_evaluation_options(datasets, overrides.get("beam"), overrides.get("generate_args") or ())
    for dataset in datasets:
        if is_language_model(dataset):
            language_model_evaluation_options(dataset, eval_overrides)
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
        # One word: a value that starts with "-" ("--no-repeat-ngram-size=3") would be taken as a flag.
        command.append("--generate-args=" + shlex.join(overrides["generate_args"]))
    if verbose:
        command.append("--verbose")
    return command + ["--", *extra_args]


def driver_environment(environ=None) -> dict:
    """The environment of a run's driver: it imports this very residual_fairseq, installed
    or not (``python scripts/reproduce.py`` from a source checkout)."""
    env = dict(os.environ if environ is None else environ)
    source_root = str(Path(__file__).resolve().parents[2])
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
            print(f"skip {run.label}: finished ({run.finished_where})", flush=True)
        else:
            pending.append(run)
    print(f"{len(pending)} runs to do, {jobs} at a time, {threads} CPU thread{'s' if threads != 1 else ''} each",
          flush=True)
    processes, active, failed = [], {}, []
    environment = driver_environment()
    with supervise.forwarding_stop_signals(processes) as received:
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
                            start_new_session=True, preexec_fn=supervise.die_with_the_driver())
                    processes.append(process)
                    active[process] = (run, log_path, time.time())
                    print(f"started {run.label} (log: {log_path})", flush=True)
                for process in [process for process in active if process.poll() is not None]:
                    run, log_path, started = active.pop(process)
                    if _report_finished_run(run, process.returncode, log_path, started, interrupted=bool(received)):
                        failed.append(run)
                if received and stop_deadline is None:
                    stop_deadline = time.monotonic() + supervise.STOP_GRACE_SECONDS + 10
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    supervise.kill_groups(list(active), signal.SIGKILL)
                time.sleep(0.2)
        finally:
            supervise.kill_groups(list(active), signal.SIGTERM)
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



def check_passthrough(extra_args) -> None:
    """Refuse fairseq-train flags after -- that this driver (or residual-fairseq-train) sets
    itself: a run named post_ln-6l seed 1 must be that architecture, depth and seed."""
    depth_flags = [word for word in extra_args if word.split("=")[0] in ("--encoder-layers", "--decoder-layers")]
    if depth_flags:
        raise UserError(f"{depth_flags[0]} after --: give depths with --layers, so that run names and "
                        f"tables show them")
    refuse_flags(extra_args, train.RUN_IDENTITY_FLAGS + train.DRIVER_SET_FLAGS,
                 "after --: residual-fairseq-reproduce sets it itself (runs are named, placed and tabulated by "
                 "--variants, --layers, --seeds and --out)")
    train.check_extra_args(extra_args)


def check_evaluation_options(datasets, beam=None, generate_args=()) -> None:
    """--beam and --generate-args against the datasets' evaluations, before anything trains:
    language models are scored by fairseq-eval-lm (no beam; --generate-args are its flags)."""
    language_models = [dataset for dataset in datasets if is_language_model(dataset)]
    if not language_models:
        check_generate_extra_args(generate_args, "reproduce offers --beam; for other settings, evaluate a run "
                                                 "directory with residual-fairseq-evaluate")
        return
    names = ", ".join(language_models)
    if beam is not None:
        kind = "is a language-model dataset" if len(language_models) == 1 else "are language-model datasets"
        raise UserError(f"--beam: {names} {kind}, scored by perplexity with fairseq-eval-lm (no beam search); "
                        "run it without --beam")
    if generate_args:
        if len(language_models) != len(datasets):
            raise UserError(f"--generate-args with both translation and language-model datasets ({names}): "
                            "fairseq-generate and fairseq-eval-lm take different flags; reproduce them separately")
        check_eval_lm_extra_args(generate_args)
