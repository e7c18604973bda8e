"""How the command-line tools run: CPU threads, log verbosity, and exit.

Threads. torch's default (one thread per core) is a poor fit for the small models and
shared machines this project is tried on: on a shared 2-core machine one thread
trained 5-9x faster than two (docs/training.md), and on the idle machine two threads
were only ~1.1x faster than one. So every driver (train, evaluate, translate, the
quickstart, analyze) uses, in order of precedence: its ``--threads N``; the environment
variable ``RESIDUAL_FAIRSEQ_THREADS``; ``OMP_NUM_THREADS`` when set; otherwise half
the cores this process may use (at least 1, at most 8). The choice is printed.

Logging. ``import fairseq`` configures the root logger at DEBUG (a wav2vec module
calls ``logging.basicConfig(level=DEBUG)``), after which every library that logs at
DEBUG (matplotlib's font search, PIL, urllib3...) floods the terminal. The CLIs reset
the root logger to INFO unless ``--verbose`` is given (:func:`configure_logging`,
called by :func:`residual_fairseq.errors.cli_main`).
"""
import atexit
import contextlib
import logging
import os
import signal
import sys
import warnings

THREADS_ENV = "RESIDUAL_FAIRSEQ_THREADS"
MAX_DEFAULT_THREADS = 8
# Third-party loggers that talk at DEBUG/INFO about their own internals.
NOISY_LOGGERS = ("matplotlib", "PIL", "urllib3", "h5py", "numexpr")


def _interrupted_while_starting(signum, frame):
    print("error: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def _is_project_command(program: str) -> bool:
    """A ``residual-fairseq-*`` console script, or ``python scripts/X.py`` of a source checkout."""
    if os.path.basename(program).startswith("residual-fairseq-"):
        return True
    checkout_scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts")
    return program.endswith(".py") and os.path.dirname(os.path.realpath(program)) == checkout_scripts


def exit_quietly_on_interrupt_while_starting() -> None:
    """In a ``residual-fairseq-*`` command (or ``python scripts/X.py``), make Ctrl-C during
    start-up one line and exit 130.

    Importing fairseq takes seconds, and it happens when the console script imports this
    package, before :func:`residual_fairseq.errors.cli_main` can catch KeyboardInterrupt.
    cli_main puts Python's own handler back (:func:`catch_interrupts`). Other programs that
    import the package (a Python session, fairseq-train with --user-dir) are left alone.
    """
    if _is_project_command(sys.argv[0] if sys.argv else ""):
        try:
            signal.signal(signal.SIGINT, _interrupted_while_starting)
        except ValueError:  # not the main thread
            pass


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):  # exiting anyway; a failed teardown must not mask the exit code
            dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Tear down torch.distributed's process group while the interpreter is still whole.

    fairseq-train never calls ``destroy_process_group``. With gloo (CPU ranks) the group's
    C++ threads are then torn down during interpreter finalization, and a rank whose peer
    has already exited may abort there ("terminate called without an active exception",
    SIGABRT) after a run that finished: 10 of 40 two-rank gloo runs here, 0 of 40 with
    this hook. An ``atexit`` handler runs before finalization; it is a no-op in a process
    without a process group, and on a failing rank it still exits promptly.
    """
    atexit.register(_destroy_process_group)


def catch_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt again (undoes :func:`exit_quietly_on_interrupt_while_starting`)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _one_line_for_user_errors(previous_hook):
    def hook(kind, error, trace):
        from .errors import UserError

        if isinstance(error, UserError):
            print(f"error: {error}", file=sys.stderr, flush=True)
        else:
            previous_hook(kind, error, trace)

    hook.residual_fairseq = True
    return hook


def report_user_errors_in_fairseq_commands() -> None:
    """In fairseq's own console scripts (fairseq-generate, -interactive, -train...), a
    :class:`~residual_fairseq.errors.UserError` that escapes them (a checkpoint the plugin
    refuses) is one ``error:`` line instead of a traceback through fairseq; the exit
    status stays Python's 1. Any other exception keeps its traceback, and programs that
    are not fairseq commands (a Python session, a user's script) are left alone.
    """
    if not os.path.basename(sys.argv[0] if sys.argv else "").startswith("fairseq-"):
        return
    if not getattr(sys.excepthook, "residual_fairseq", False):
        sys.excepthook = _one_line_for_user_errors(sys.excepthook)
    _compact_user_errors_in_hydra()


def _compact_user_errors_in_hydra() -> None:
    """fairseq-hydra-train: hydra reports a failed job itself (a traceback, exit 1), so
    the excepthook never sees it, except for its own config errors, which it prints as
    their message alone. A UserError (a bad option in a yaml) joins those: hydra's
    ``Error executing job with overrides: [...]`` line, then the message."""
    hydra_utils = sys.modules.get("hydra._internal.utils")
    compact = getattr(hydra_utils, "CompactHydraException", None)
    if compact is None:
        return  # not under hydra (or a hydra that reports otherwise)
    from .errors import UserError

    if not (isinstance(compact, tuple) and UserError in compact):
        # run_and_report only tests isinstance(ex, CompactHydraException): a tuple works there
        hydra_utils.CompactHydraException = (compact, UserError)


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
    from .argtypes import is_digits

    for variable in (THREADS_ENV, "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if is_digits(value) and int(value) >= 1:
            if int(value) > MAX_THREADS:  # as --threads: torch would run out of memory reserving them
                from .errors import UserError

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
    from .argtypes import int_at_least

    # (torch refuses more than it can count, and each thread reserves memory: 99999 ran out of it)
    parser.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=None,
                        help=f"torch CPU threads (default: ${THREADS_ENV}, else $OMP_NUM_THREADS, else half the cores)")


def add_verbose_flag(parser):
    parser.add_argument("--verbose", action="store_true", help="also show DEBUG log lines")


def undo_debug_logging_of_fairseq_import(level_before: int) -> None:
    """Put the root logger back to its level from before importing fairseq, when that
    import (not the user) set it to DEBUG.

    Importing fairseq sets the root logger to DEBUG: matplotlib's font search, and
    fairseq's INFO chatter on every batch iterator, would reach a Python user who never
    asked for logging. The CLIs set their own level (:func:`configure_logging`: INFO,
    DEBUG with --verbose); a root logger the user had set to DEBUG is left alone.
    """
    root = logging.getLogger()
    if root.level == logging.DEBUG and level_before != logging.DEBUG:
        root.setLevel(level_before)


def configure_logging(verbose: bool = False) -> None:
    """Root logger at INFO (DEBUG with ``verbose``); chatty libraries at WARNING unless verbose."""
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


@contextlib.contextmanager
def quiet_hub_batches():
    """fairseq's hub interface builds its batch iterator with ``pin_memory=True``; on a
    machine without CUDA torch warns about it on every call. Only that warning is hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator",
                                category=UserWarning)
        yield
