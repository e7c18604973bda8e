"""Every global change that importing residual_fairseq makes, in one place: :func:`install`.

``residual_fairseq/__init__.py`` calls :func:`install` once; the reasons, measured,
are in docs/reliability.md ("What the plugin changes in fairseq"). Each change leaves
fairseq's behaviour for its own models as it was (tests/test_no_side_effects.py):
it closes a hole or turns a traceback into one line.
"""
import atexit
import contextlib
import os
import sys

from .errors import UserError, quiet_interrupts

_fairseq_load_checkpoint_to_cpu = None  # fairseq's own loader, before the guard replaced it


def install() -> None:
    """Make every global change importing the plugin makes; safe to call again. In order:

    1. Ctrl-C while a ``residual-fairseq-*`` command (``python scripts/X.py``,
       ``python -m residual_fairseq...``) starts is ``error: interrupted``, exit 130, and
       SIGTERM ``error: terminated``, exit 143 (unless SIGTERM's handler was set before):
       importing fairseq takes seconds before the command's ``cli_main`` can catch it
       (:func:`exit_quietly_on_interrupt_while_starting`; first, before any other import;
       ``cli_main`` gives Python's KeyboardInterrupt back while the command's main runs,
       and this handler again while it reports an error or exits).
    2. In fairseq's own console scripts (fairseq-generate, -train...), a UserError that
       escapes them (a refused checkpoint) is one ``error:`` line, not a traceback through
       fairseq (:func:`report_user_errors_in_fairseq_commands`).
    3. At exit, a torch.distributed process group fairseq left behind is destroyed while
       the interpreter is whole: else a gloo rank may abort after a finished run
       (:func:`destroy_process_group_at_exit`).
    4. ``import fairseq`` (it sets the root logger to DEBUG: undone in 10).
    5. ``torch.load(weights_only=True)`` may rebuild the few globals real fairseq
       checkpoints hold (``argparse.Namespace``, numpy's int64 metrics), nothing else
       (:func:`residual_fairseq.checkpoints.fairseq_checkpoint_globals`).
    6. fairseq opens every checkpoint file through the plugin's checks, before it is
       unpickled: ``checkpoint_utils.load_checkpoint_to_cpu``, here and wherever fairseq
       imported it by name (:func:`install_loading_guard`).
    7. ``from_pretrained`` of a model archive extracts it through tarfile's data filter
       into a temporary folder and leaves the archive in place (fairseq's
       ``file_utils.load_archive_file`` extracts unfiltered and deletes it).
    8. Every loaded fairseq module that calls the builtin ``eval`` gets a literal-only
       ``eval``: a checkpoint's config strings cannot run code
       (:func:`residual_fairseq.checkpoints.config_strings.close_fairseq_eval_calls`;
       modules imported later are closed when the next checkpoint is opened).
    9. In a fairseq-train that residual-fairseq-train resumed, ``--patience`` continues
       its count instead of starting over (:mod:`residual_fairseq.early_stopping`;
       nothing without the driver's environment variable).
    10. The root logger is put back to its level from before importing fairseq, unless
        the user had set DEBUG (:func:`undo_debug_logging_of_fairseq_import`).

    Not at import but on the first check of a checkpoint's config against its weights:
    torch.nn.init's public functions and (only during that build) fairseq's sinusoidal
    table skip their work while *that thread* builds a model on the meta device, and
    behave as before for every other caller (:mod:`residual_fairseq.checkpoints.sizes`: saves 2-3 s of torch._dynamo import).
    """
    exit_quietly_on_interrupt_while_starting()
    import logging

    root_level = logging.getLogger().level
    report_user_errors_in_fairseq_commands()
    destroy_process_group_at_exit()

    import fairseq  # noqa: F401  (the seconds of the import)
    import torch

    from . import early_stopping
    from .checkpoints import fairseq_checkpoint_globals
    from .checkpoints.config_strings import close_fairseq_eval_calls

    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
    install_loading_guard()
    close_fairseq_eval_calls()
    early_stopping.restore_in_fairseq_train()
    undo_debug_logging_of_fairseq_import(root_level)


# --- 1. Ctrl-C while starting -------------------------------------------------------------------


def _is_project_command(argv, orig_argv=()) -> bool:
    """A ``residual-fairseq-*`` console script, ``python scripts/X.py`` of a source checkout,
    or ``python -m residual_fairseq...`` (while ``-m`` imports the package, ``argv[0]`` is
    "-m" and only the original command line names the module)."""
    program = argv[0] if argv else ""
    if os.path.basename(program).startswith("residual-fairseq-"):
        return True
    if program == "-m":
        module = next((orig_argv[i + 1] for i, word in enumerate(orig_argv[:-1]) if word == "-m"), "")
        return module.split(".")[0] == "residual_fairseq"
    checkout_scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "scripts")
    return program.endswith(".py") and os.path.dirname(os.path.realpath(program)) == checkout_scripts


def exit_quietly_on_interrupt_while_starting() -> None:
    """In a project command (:func:`_is_project_command`), make Ctrl-C during start-up one
    line and exit 130 (SIGTERM: one line, exit 143).

    Importing fairseq takes seconds, and it happens when the console script imports this
    package, before :func:`residual_fairseq.errors.cli_main` can catch KeyboardInterrupt.
    cli_main puts Python's own handler back while the command's main runs
    (:func:`residual_fairseq.errors.catch_interrupts`) and this one again when it ends.
    Other programs that import the package (a Python session, fairseq-train with
    --user-dir) are left alone.
    """
    if _is_project_command(sys.argv, getattr(sys, "orig_argv", ())):
        quiet_interrupts()


# --- 2. one line for a UserError in fairseq's console scripts -----------------------------------


def _one_line_for_user_errors(previous_hook):
    def hook(kind, error, trace):
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
    if not (isinstance(compact, tuple) and UserError in compact):
        # run_and_report only tests isinstance(ex, CompactHydraException): a tuple works there
        hydra_utils.CompactHydraException = (compact, UserError)


# --- 3. the process group at exit ---------------------------------------------------------------


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
    atexit.unregister(_destroy_process_group)  # (install() may run again: register once)
    atexit.register(_destroy_process_group)


# --- 6./7. fairseq opens checkpoints and model archives through the plugin ----------------------


def install_loading_guard() -> None:
    """Make fairseq open checkpoint files with
    :func:`residual_fairseq.checkpoints.load_checkpoint_to_cpu`, in
    ``fairseq.checkpoint_utils`` and in every fairseq module that imported it by name,
    and model archives with :func:`residual_fairseq.checkpoints.load.load_archive_file`."""
    global _fairseq_load_checkpoint_to_cpu
    from fairseq import checkpoint_utils, file_utils

    from .checkpoints.load import load_archive_file, load_checkpoint_to_cpu

    if _fairseq_load_checkpoint_to_cpu is None:
        _fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("fairseq", "fairseq_cli") and \
                getattr(module, "load_checkpoint_to_cpu", None) is _fairseq_load_checkpoint_to_cpu:
            module.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    file_utils.load_archive_file = load_archive_file  # (hub_utils looks it up on the module per call)


# --- 10. the root logger ------------------------------------------------------------------------


def undo_debug_logging_of_fairseq_import(level_before: int) -> None:
    """Put the root logger back to its level from before importing fairseq, when that
    import (not the user) set it to DEBUG.

    Importing fairseq sets the root logger to DEBUG: matplotlib's font search, and
    fairseq's INFO chatter on every batch iterator, would reach a Python user who never
    asked for logging. The CLIs set their own level
    (:func:`residual_fairseq.errors.configure_logging`: INFO, DEBUG with --verbose); a
    root logger the user had set to DEBUG is left alone.
    """
    import logging

    root = logging.getLogger()
    if root.level == logging.DEBUG and level_before != logging.DEBUG:
        root.setLevel(level_before)
