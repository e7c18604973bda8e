"""How the command-line tools run: CPU threads, log verbosity, fairseq's executables.

Threads. torch's default (one thread per core) is a poor fit for the small models and
shared machines this project is tried on: on a shared 2-core machine one thread
trained 5-9x faster than two (docs/training.md), and on the idle machine two threads
were only ~1.1x faster than one. So every driver (train, evaluate, translate, the
quickstart, analyze) uses, in order of precedence: its ``--threads N``; the environment
variable ``RESIDUAL_FAIRSEQ_THREADS``; ``OMP_NUM_THREADS`` when set; otherwise half
the cores this process may use (at least 1, at most 8). The choice is printed.

Logging. ``import fairseq`` configures the root logger at DEBUG (a wav2vec module
calls ``logging.basicConfig(level=DEBUG)``), after which every library that logs at
DEBUG (matplotlib's font search, PIL, urllib3...) floods the terminal. Importing the
plugin puts the root logger back (:mod:`residual_fairseq.fairseq_patches`), and the
CLIs set it to INFO unless ``--verbose`` is given (:func:`add_verbose_flag`;
:func:`residual_fairseq.errors.configure_logging`, called by
:func:`residual_fairseq.errors.cli_main`).
"""
import contextlib
import os
import sys
import warnings

from .argtypes import int_at_least, is_digits
from .errors import UserError

THREADS_ENV = "RESIDUAL_FAIRSEQ_THREADS"
MAX_DEFAULT_THREADS = 8


def fairseq_executable(name: str) -> str:
    """The fairseq console script ``name`` (``fairseq-train``...) of this Python's
    environment, else the one on PATH: a subprocess runs the fairseq this process imports."""
    import shutil
    from pathlib import Path

    beside_python = Path(sys.executable).with_name(name)
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which(name) or name


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads():
    """(threads, where the number came from) when no ``--threads`` is given."""
    for variable in (THREADS_ENV, "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if is_digits(value) and int(value) >= 1:
            if int(value) > MAX_THREADS:  # as --threads: torch would run out of memory reserving them
                raise UserError(f"{variable}={value}: at most {MAX_THREADS} threads")
            return int(value), variable
    cores = available_cores()
    return max(1, min(MAX_DEFAULT_THREADS, cores // 2)), f"half of {cores} cores"


def resolve_threads(requested=None):
    """(threads, description) for ``--threads requested`` (None: the default)."""
    if requested is not None:
        return requested, "--threads"
    return default_threads()


def thread_environment(threads: int, environ=None) -> dict:
    """A copy of the environment that makes a torch subprocess use ``threads`` threads."""
    env = dict(os.environ if environ is None else environ)
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(threads)
    return env


def use_threads(requested=None, announce=print) -> int:
    """Set this process's torch thread count (and the environment its children inherit); say so."""
    import torch

    threads, source = resolve_threads(requested)
    torch.set_num_threads(threads)
    os.environ.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    if announce:
        announce(threads_note(threads, source))
    return threads


def threads_note(threads: int, source: str) -> str:
    return f"note: {threads} CPU thread{'s' if threads != 1 else ''} ({source}; --threads N or {THREADS_ENV}=N to change)"


MAX_THREADS = 1024


def add_threads_flag(parser):
    # (torch refuses more than it can count, and each thread reserves memory: 99999 ran out of it)
    parser.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=None,
                        help=f"torch CPU threads (default: ${THREADS_ENV}, else $OMP_NUM_THREADS, else half the cores)")


def add_verbose_flag(parser):
    parser.add_argument("--verbose", action="store_true", help="also show DEBUG log lines")


@contextlib.contextmanager
def quiet_hub_batches():
    """fairseq's hub interface builds its batch iterator with ``pin_memory=True``; on a
    machine without CUDA torch warns about it on every call. Only that warning is hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator",
                                category=UserWarning)
        yield
