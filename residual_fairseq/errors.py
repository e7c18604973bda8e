"""One error type for everything a user can get wrong, and the CLI wrapper for it.

Every command of the project turns a :class:`UserError` into one line on stderr,
``error: <message>``, and exit status 2: no traceback wall for bad input. So is an
``OSError`` (a full disk, a read-only directory: ``error: <reason>: <file>``); a closed
pipe on stdout (``| head``) ends the command quietly with status 141, as in Unix tools.
Ctrl-C is ``error: interrupted`` and exit status 130 whenever it lands: while the
command starts (:func:`interrupted_while_starting`, installed by
:mod:`residual_fairseq.fairseq_patches` before fairseq is imported), while it runs
(KeyboardInterrupt), and while it reports an error or exits (the start-up handler again). The wrapper also keeps DEBUG log lines
off the terminal unless ``--verbose`` is on the command line (:func:`configure_logging`).

Only the standard library is imported here: every other module may import this one.
"""
import functools
import os
import signal
import sys

INTERRUPTED_EXIT_STATUS = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended
TERMINATED_EXIT_STATUS = 143  # 128 + SIGTERM
# Third-party loggers that talk at DEBUG/INFO about their own internals.
NOISY_LOGGERS = ("matplotlib", "PIL", "urllib3", "h5py", "numexpr")


class UserError(Exception):
    """Bad input or options; the message says what, in one line."""


def one_line(message: str) -> str:
    """``message`` on one line: a user's path or value may hold line breaks."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def interrupted_while_starting(signum, frame):
    """SIGINT handler while a command starts (imports fairseq) or ends: one line, exit 130, now."""
    os.write(2, b"error: interrupted\n")
    os._exit(INTERRUPTED_EXIT_STATUS)


def terminated_while_starting(signum, frame):
    """SIGTERM handler while a command starts or ends: one line, exit 143, now."""
    os.write(2, b"error: terminated\n")
    os._exit(TERMINATED_EXIT_STATUS)


def quiet_interrupts() -> None:
    """Ctrl-C is one line and exit 130 at once (:func:`interrupted_while_starting`), and
    SIGTERM one line and exit 143 (unless something set SIGTERM's handler before us)."""
    try:
        signal.signal(signal.SIGINT, interrupted_while_starting)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, terminated_while_starting)
    except ValueError:  # not the main thread
        pass


def catch_interrupts() -> bool:
    """Ctrl-C raises KeyboardInterrupt again and SIGTERM has its default action (undoes
    :func:`quiet_interrupts`); whether Ctrl-C was quiet."""
    if signal.getsignal(signal.SIGTERM) is terminated_while_starting:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return True
    return False


def configure_logging(verbose: bool = False) -> None:
    """Root logger at INFO (DEBUG with ``verbose``); chatty libraries at WARNING unless verbose."""
    import logging

    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def cli_main(main):
    """Decorate a ``main(argv=None)`` so that user errors end it cleanly."""

    @functools.wraps(main)
    def wrapper(argv=None):
        quiet = False  # whether this is the command's own main, started with quiet interrupts
        try:
            quiet = catch_interrupts()
            words = sys.argv[1:] if argv is None else [str(word) for word in argv]
            configure_logging(verbose="--verbose" in words[:words.index("--")] if "--" in words
                              else "--verbose" in words)
            return main(argv)
        except BaseException as err:
            if quiet:
                quiet_interrupts()  # a Ctrl-C while this one is reported, or while exiting: the same line
            _end(err)
        finally:
            if quiet:
                quiet_interrupts()

    return wrapper


def _end(err: BaseException):
    """End the command for ``err`` (the exception being handled): one line and its exit status."""
    if isinstance(err, UserError):
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        sys.exit(2)
    if isinstance(err, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_STATUS)
    if isinstance(err, BrokenPipeError):
        # The reader of our output went away (`... | head`): stop quietly, as Unix tools do.
        # stdout is pointed at /dev/null so that Python's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    if isinstance(err, OSError):
        # The system refused a read or write (a full disk, a read-only directory, no
        # permission): the user's to fix, so one line naming the file.
        where = f": {err.filename}" if err.filename else ""
        print(f"error: {one_line(f'{err.strerror or err}{where}')}", file=sys.stderr)
        sys.exit(2)
    raise err
