"""Run the paper's matrix (dataset x variant x depth x seed) and tabulate it.

Each run trains with :mod:`residual_fairseq.train` (which resumes an interrupted
run) and is then evaluated on the test set with
:func:`residual_fairseq.evaluate.evaluate_run`; a run whose ``result.json`` exists
is finished and skipped. :mod:`residual_fairseq.reproduce_report` then writes the
tables (mean +/- std over seeds, and every run seed by seed) and the validation
curves. ``--jobs N`` runs N at a time.

Layout::

    OUT/runs/<dataset>/<variant>-<L>l/seed<S>/   checkpoints, train.log, run.json, result.json
    OUT/results.md  OUT/results.csv  OUT/runs.md  OUT/runs.json  OUT/curves.png

CLI::

    residual-fairseq-reproduce --dataset sample-es-en --data data/sample/bin \\
        --variants post_ln resi_dual --seeds 1 2 --out results/sample
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from . import configs, train
from .argtypes import (MAX_SEED, check_output_dir, int_at_least, is_finite_number, positive_int, read_regular_file,
                       same_file, shell_words)
from .atomic import write_text_atomically
from .data.pipeline import is_prepare_manifest, read_manifest
from .errors import UserError, cli_main
# Imported now, not when the first run is evaluated hours later: a driver must run one
# version of the package throughout, even if it is updated meanwhile (mixing modules
# of two versions once killed a driver at its first evaluation).
from .evaluate import check_generate_extra_args, evaluate_run
from .language_models import check_eval_lm_extra_args, eval_lm_command, evaluate_lm
from .passthrough import refuse_flags
from .reproduce_report import (RECORD_RANGES, dig, how_training_ended, in_range, is_count, is_language_model,
                               read_finished_runs, record_problem, result_from_record, write_reports)
from .runtime import add_threads_flag, add_verbose_flag, available_cores
from .training_log import validation_curve
from .variants import VARIANTS

RESULT_NAME = "result.json"
FAILURE_NAME = "failed.json"   # a run that failed: its error, shown in the table; removed by a later success
RESULT_MAX_BYTES = 1024 * 1024        # evaluation writes a few hundred bytes
FAILURE_MAX_BYTES = 1024 * 1024
FAILURE_MAX_CHARS = 500               # a table cell, not a log
# result.json's keys for the record columns that record_problem names.
_RESULT_KEYS = {"test_tok_bleu": "tokenized_bleu.score", "test_bleu": "sacrebleu.score", "test_chrf": "chrf.score",
                "test_ppl": "perplexity", "test_loss": "loss_base2", "an odd beam": "an odd generation.beam",
                "sacrebleu_signature": "sacrebleu.signature"}


def recordable_validation(point: dict) -> Optional[dict]:
    """``point`` as --finished-runs reads it back (a bleu out of range becomes None), or None
    when its loss is not a number it accepts: a diverged validation's nan would otherwise
    make the best loss depend on where it falls (min() over nan) and runs.json unreadable."""
    if not (is_count(point["epoch"]) and is_count(point["updates"]) and in_range(point["loss"], *RECORD_RANGES["loss"])):
        return None
    bleu = point["bleu"] if point["bleu"] is not None and in_range(point["bleu"], *RECORD_RANGES["bleu"]) else None
    return {**point, "bleu": bleu}


def table_cell_text(text: str) -> str:
    """``text`` on one line without '|', shortened: it goes into a markdown table cell."""
    text = " ".join("".join(char if char.isprintable() else " " for char in text).split()).replace("|", "/")
    return text if len(text) <= FAILURE_MAX_CHARS else text[:FAILURE_MAX_CHARS - 3] + "..."


@dataclass(frozen=True)
class Run:
    dataset: str
    variant: str
    layers: int
    seed: int
    data: Path
    out: Path
    # Its record in an earlier runs.json (--finished-runs), when it finished there and not
    # in ``out``: its numbers and validations come from that record.
    record: Optional[dict] = field(default=None, compare=False, repr=False)
    record_path: Optional[Path] = field(default=None, compare=False, repr=False)

    @property
    def save_dir(self) -> Path:
        return self.out / "runs" / self.dataset / configs.config_name(self.variant, self.layers) / f"seed{self.seed}"

    @property
    def result_path(self) -> Path:
        return self.save_dir / RESULT_NAME

    @property
    def finished_here(self) -> bool:
        return self.result_path.is_file()

    @property
    def finished(self) -> bool:
        return self.finished_here or self.record is not None

    @property
    def from_record(self) -> bool:
        """Finished elsewhere and not here: tabulated from its runs.json record."""
        return self.record is not None and not self.finished_here

    @property
    def finished_where(self) -> Path:
        return self.record_path if self.from_record else self.result_path

    def curve(self) -> list:
        """Every validation of the run (see training_log.validation_curve), from its record
        when it finished elsewhere."""
        if self.from_record:
            return [dict(point) for point in self.record["validations"]]
        points = (recordable_validation(point) for point in validation_curve(self.save_dir / train.LOG_NAME))
        return [point for point in points if point is not None]

    def ended_by(self) -> Optional[str]:
        """'patience N', 'budget' or None (see reproduce_report.how_training_ended)."""
        if self.from_record:
            return self.record.get("ended_by")
        return how_training_ended(self.save_dir / train.LOG_NAME)

    def result(self) -> dict:
        """result.json, checked: UserError naming it when it is not what evaluation writes."""
        if self.from_record:
            return result_from_record(self.record)
        raw = read_regular_file(self.result_path, RESULT_MAX_BYTES, "result file", kind="result.json")
        try:
            result = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            result, problem = None, f"cannot be read ({err.__class__.__name__})"
        else:
            scores = ((("perplexity",), ("loss_base2",)) if is_language_model(self.dataset)
                      else (("sacrebleu", "score"), ("chrf", "score")))
            missing = [".".join(keys) for keys in scores if not is_finite_number(dig(result, keys))]
            problem = f"has no numeric {', '.join(missing)}" if missing else self._result_problem(result)
        if problem:
            raise UserError(f"{self.result_path} {problem}: it is not a result this tool wrote; "
                            f"delete it to evaluate the run again")
        return result

    def _result_problem(self, result: dict) -> Optional[str]:
        """What in ``result`` (numbers present) its runs.json record would be refused for by
        --finished-runs: the same ranges and types, so that no table shows a score a record
        could not hold, and runs.json always loads again."""
        record = {"dataset": self.dataset, "variant": self.variant, "layers": self.layers, "seed": self.seed,
                  "validations": [], "checkpoint": Path(str(result.get("checkpoint", "?"))).name}
        if is_language_model(self.dataset):
            record.update(test_ppl=result["perplexity"], test_loss=result["loss_base2"])
        else:
            tokenized_bleu = dig(result, ("tokenized_bleu", "score"))  # optional, as run_metrics reads it
            record.update(test_bleu=result["sacrebleu"]["score"], test_chrf=result["chrf"]["score"],
                          test_tok_bleu=tokenized_bleu if is_finite_number(tokenized_bleu) else None,
                          beam=dig(result, ("generation", "beam")),
                          sacrebleu_signature=dig(result, ("sacrebleu", "signature")))
        problem = record_problem(record)
        for column, key in (_RESULT_KEYS.items() if problem else ()):
            problem = problem.replace(column, key)
        return problem

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
        # Read as hostile (anything may sit there): one that is not what reproduce writes says "failed".
        try:
            record = json.loads(read_regular_file(self.failure_path, FAILURE_MAX_BYTES, "failed run record")
                                .decode("utf-8"))
        except (UserError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return "failed"
        error = record.get("error", "failed") if isinstance(record, dict) else None
        return (table_cell_text(error) or "failed") if isinstance(error, str) else "failed"


def matrix(data: dict, out: Path, variants=None, layers=None, seeds=(1,), finished_elsewhere=None) -> List[Run]:
    """Every run of the matrix; ``data`` maps each dataset to its fairseq data directory.

    ``variants`` None means every variant of each dataset's task (language models: three).
    ``layers`` None means each dataset's shipped depths; any other depth is composed
    from the dataset's base.yaml (as ``residual-fairseq-train --layers`` does).
    ``finished_elsewhere``: reproduce_report.read_finished_runs of earlier runs.json
    files; a run finished in ``out`` keeps its own result.
    """
    runs = []
    elsewhere = finished_elsewhere or {}
    for dataset, data_dir in data.items():
        for depth in (layers or configs.DATASETS[dataset].depths):
            for variant in (variants or configs.DATASETS[dataset].variants):
                configs.check_choice(dataset, variant, depth, shipped_only=False)
                for seed in seeds:
                    record, path = elsewhere.get((dataset, variant, depth, seed), (None, None))
                    runs.append(Run(dataset, variant, depth, seed, Path(data_dir), Path(out), record, path))
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
        method = dig(manifest, ("subword", "method"))
        if not isinstance(method, str):
            raise UserError(f"{run.data.parent / 'manifest.json'} names no subword method: re-run "
                            f"residual-fairseq-prepare, or give data prepared elsewhere without its manifest.json")
        options["subword"] = method
        if dig(manifest, ("settings", "tokenizer")) == "moses":
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


# evaluate_lm's keyword arguments that an evaluation override may set; "generate_args"
# (--generate-args) are its extra fairseq-eval-lm flags.
LM_EVALUATION_OPTIONS = ("tokens_per_sample", "context_window", "max_tokens", "extra_args")


def language_model_evaluation_options(dataset: str, eval_overrides=None) -> dict:
    """evaluate_lm keyword arguments: the dataset's, then ``eval_overrides`` (``generate_args``
    become the extra fairseq-eval-lm flags). A translation-only override (``beam``,
    ``lenpen``...) is refused: perplexity has no decoding to change."""
    overrides = dict(eval_overrides or {})
    if "generate_args" in overrides:
        overrides["extra_args"] = list(overrides.pop("generate_args") or ())
    unused = [key for key, value in overrides.items() if key not in LM_EVALUATION_OPTIONS and value is not None]
    if unused:
        flags = ", ".join("--" + key.replace("_", "-") for key in unused)
        raise UserError(f"{flags}: {dataset} is a language-model dataset, scored by perplexity with "
                        f"fairseq-eval-lm: there is no decoding for {flags} to change")
    options = {**configs.DATASETS[dataset].evaluation, **overrides}
    options = {key: value for key, value in options.items() if key in LM_EVALUATION_OPTIONS}
    check_eval_lm_extra_args(options.get("extra_args", ()))
    return options


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
            print(f"skip {run.label}: finished ({run.finished_where})", flush=True)
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
    # Every list flag is action="extend": given twice, it keeps both lists (argparse's default
    # keeps the last one and silently drops the rest, e.g. one of two --finished-runs files).
    parser.add_argument("--dataset", nargs="+", action="extend", required=True, choices=list(configs.DATASETS))
    parser.add_argument("--data", nargs="+", action="extend", required=True, metavar="[DATASET=]DIR",
                        help="fairseq data directory (the prepared bin/) of each dataset")
    parser.add_argument("--variants", nargs="+", action="extend", choices=VARIANTS,
                        help="default: every variant of each dataset's task (language models: post_ln pre_ln resi_dual)")
    parser.add_argument("--layers", nargs="+", action="extend", type=int_at_least(1, configs.MAX_LAYERS),
                        help="depths, any (default: each dataset's shipped depths)")
    parser.add_argument("--seeds", nargs="+", action="extend", type=int_at_least(0, MAX_SEED), help="default: 1")
    parser.add_argument("--out", required=True, help="runs and reports go here")
    parser.add_argument("--finished-runs", nargs="+", action="extend", default=[], metavar="RUNS_JSON",
                        help="runs.json of earlier parts of the matrix (another machine, another --out): "
                             "the runs finished there are skipped and tabulated from it, without their "
                             "checkpoints")
    parser.add_argument("--nprocs", type=positive_int, default=1, help="processes per training (see residual-fairseq-train)")
    parser.add_argument("--beam", type=int_at_least(1, 1000),
                        help="test-set beam size (default: the dataset's; translation only)")
    parser.add_argument("--generate-args", type=shell_words, default=[],
                        help='extra fairseq-generate flags for the test set, e.g. "--max-len-b 50" (language '
                             'models: extra fairseq-eval-lm flags)')
    add_threads_flag(parser)
    add_verbose_flag(parser)
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="runs at a time, each with --threads threads (default: the cores shared out); "
                             "on one GPU they share it")
    parser.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)  # a --jobs run: its parent reports
    parser.add_argument("--report-only", action="store_true", help="only (re)write the tables and plot")
    parser.add_argument("--dry-run", action="store_true", help="print every command without running")
    return parser


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


def finished_runs(paths, out: Path) -> dict:
    """read_finished_runs of ``--finished-runs``, refusing this --out's own runs.json: the
    tables rewrite it, and records of runs outside this matrix would be gone from it."""
    for path in paths:
        if same_file(path, out / "runs.json"):
            raise UserError(f"--finished-runs {path} is this --out's runs.json, which this command rewrites: "
                            f"copy it elsewhere and give the copy")
    return read_finished_runs(paths)


def say_where_runs_come_from(runs: List[Run], finished_elsewhere: dict) -> None:
    """A note for records this matrix leaves out, and for runs finished both here and elsewhere."""
    keys = {(run.dataset, run.variant, run.layers, run.seed) for run in runs}
    outside = [key for key in finished_elsewhere if key not in keys]
    if outside:
        print(f"note: {len(outside)} finished runs of --finished-runs are outside this matrix "
              f"(--dataset/--variants/--layers/--seeds) and left out of its tables", flush=True)
    for run in runs:
        if run.record is not None and run.finished_here:
            print(f"note: {run.label} finished both here ({run.result_path}) and in {run.record_path}: "
                  f"tabulating this --out's", flush=True)


@cli_main
def main(argv=None):
    ours, passthrough = train.split_passthrough(argv)
    args = build_parser().parse_args(ours)
    check_output_dir(args.out, "--out")
    check_passthrough(passthrough)
    check_evaluation_options(args.dataset, args.beam, args.generate_args)
    # in the order given, once each
    args.layers = list(dict.fromkeys(args.layers)) if args.layers else None
    args.seeds = list(dict.fromkeys(args.seeds or [1]))
    data = parse_data(args.data, args.dataset)
    elsewhere = finished_runs(args.finished_runs, Path(args.out))
    runs = matrix(data, Path(args.out), args.variants, args.layers, args.seeds, elsewhere)
    say_where_runs_come_from(runs, elsewhere)
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
