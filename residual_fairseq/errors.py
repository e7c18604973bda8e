"""One error type for everything a user can get wrong, and the CLI wrapper for it.

Every command of the project turns a :class:`UserError` into one line on stderr,
``error: <message>``, and exit status 2: no traceback wall for bad input. So is an
``OSError`` (a full disk, a read-only directory: ``error: <reason>: <file>``); a closed
pipe on stdout (``| head``) ends the command quietly with status 141, as in Unix tools. It also
keeps DEBUG log lines off the terminal unless ``--verbose`` is on the command line
(:func:`residual_fairseq.runtime.configure_logging`).
"""
import functools
import sys


class UserError(Exception):
    """Bad input or options; the message says what, in one line."""


def one_line(message: str) -> str:
    """``message`` on one line: a user's path or value may hold line breaks."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def cli_main(main):
    """Decorate a ``main(argv=None)`` so that user errors end it cleanly."""

    @functools.wraps(main)
    def wrapper(argv=None):
        from .runtime import catch_interrupts, configure_logging

        catch_interrupts()
        words = sys.argv[1:] if argv is None else [str(word) for word in argv]
        configure_logging(verbose="--verbose" in words[:words.index("--")] if "--" in words else "--verbose" in words)
        try:
            return main(argv)
        except UserError as err:
            print(f"error: {one_line(str(err))}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            sys.exit(130)
        except BrokenPipeError:
            # The reader of our output went away (`... | head`): stop quietly, as Unix tools do.
            # stdout is pointed at /dev/null so that Python's final flush does not fail again.
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as err:
            # The system refused a read or write (a full disk, a read-only directory, no
            # permission): the user's to fix, so one line naming the file.
            where = f": {err.filename}" if err.filename else ""
            print(f"error: {one_line(f'{err.strerror or err}{where}')}", file=sys.stderr)
            sys.exit(2)

    return wrapper
