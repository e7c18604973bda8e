"""Checks of command-line values, so that nonsense is refused when the command line is parsed.

The number types are argparse ``type=`` callables: a bad value ends the command with
argparse's one line (``prog: error: argument --beam: must be at least 1, got 0``) and
exit status 2, before anything is loaded or written. The path checks raise
:class:`~residual_fairseq.errors.UserError` for an output that could not be written
(an existing directory where a file goes, a parent that is a file), which a CLI
turns into ``error: ...`` and exit 2, also before any work. :func:`refuse_repeated_options`
makes a parser refuse a single-valued option given twice with different values.
"""
import argparse
import math
import os
import shlex
import stat
import weakref
from pathlib import Path

from .errors import UserError


def _number(text, kind):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")


# fairseq shuffles epoch N's batches with numpy seed ``seed + N``, and numpy takes seeds below
# 2**32 (checked only once training starts): half that range leaves room for any number of epochs.
MAX_SEED = 2 ** 31 - 1


def is_digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes digits int() refuses ("²") or reads otherwise ("٣")."""
    return text.isascii() and text.isdigit()


def int_at_least(minimum: int, maximum: int = None):
    def parse(text):
        value = _number(text, int)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def is_finite_number(value) -> bool:
    """An int or float (not a bool) that is finite, for values read from JSON or configs a
    user hands over. An int too large for a float (JSON allows 10**400) is not one: it
    would overflow wherever it is used as a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def positive_number(kind):
    """A finite number > 0 of type ``kind`` (int or float): the models' dual-stream options
    and ResiDual's layer counts."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def layer_count(text):
    """An integer >= 1: the layer counts of the Post-LN family (deepnet, admin, b2t)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def finite_float(text):
    value = _number(text, float)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


# A length penalty is the exponent of (length + 1): beyond this, the scores overflow (1e308
# was an OverflowError traceback); fairseq's recipes use 0.6-2.
MAX_LENPEN = 100.0


def length_penalty(text):
    value = finite_float(text)
    if abs(value) > MAX_LENPEN:
        raise argparse.ArgumentTypeError(f"must be from -{MAX_LENPEN:g} to {MAX_LENPEN:g}, got {text}")
    return value


def positive_float(text):
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def finite_positive_float(text):
    """A number above 0 that is finite (0, inf or nan as a scale, rate or size trains a model of NaNs)."""
    value = _number(text, float)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
    return value


def nonnegative_float(text):
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def shell_words(text):
    """A shell-quoted string of extra arguments (``--generate-args``), split; unbalanced quotes are refused."""
    try:
        return shlex.split(text)
    except ValueError as err:  # "No closing quotation", "No escaped character"
        raise argparse.ArgumentTypeError(f"cannot split {text!r} like a shell: {str(err).lower()}")


# --- output paths ---------------------------------------------------------------------------

def _blocking_parent(path: Path):
    """The first existing ancestor of ``path`` that is not a directory, or None."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def same_file(a, b) -> bool:
    """Whether two paths name one file: the same path once resolved (even before it exists),
    or the same file through links."""
    a, b = Path(a), Path(b)
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):  # a symlink loop: compare what can be compared
        pass
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_repeats(values, flag: str, text: str = None) -> None:
    """UserError when a value of a list option is given twice: it would be run twice and shown as
    two rows (or seeds) of one setting, or one of two values would silently win. ``text``: the
    option as given (default: the values joined by spaces)."""
    values = list(values)
    repeated = next((value for number, value in enumerate(values) if value in values[:number]), None)
    if repeated is not None:
        shown = repr(text) if text is not None else " ".join(map(str, values))
        raise UserError(f"{flag} {shown}: {repeated} is given twice; give each once")


def check_output_file(path, flag: str) -> Path:
    """Refuse an output file path that cannot be written: a directory, or under a file."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: give a file name")
    blocking = _blocking_parent(path)
    if blocking is not None:
        raise UserError(f"{flag} {path}: {blocking} is a file, not a directory")
    existing = next((parent for parent in path.parents if parent.is_dir()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: cannot write in {existing}")
    return path


def check_output_dir(path, flag: str) -> Path:
    """Refuse an output directory path that is a file or lies under a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory")
    blocking = _blocking_parent(path)
    if blocking is not None:
        raise UserError(f"{flag} {path}: {blocking} is a file, not a directory")
    existing = path if path.is_dir() else next((p for p in path.parents if p.is_dir()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: cannot write in {existing}")
    return path


# --- user text --------------------------------------------------------------------------------

# Byte-order marks, longest first: the UTF-32-LE mark begins with the UTF-16-LE one.
BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"),
)


def text_encoding(data: bytes):
    """``(encoding, mark length)`` of text a user handed us: UTF-8 unless a byte-order mark says
    otherwise and the bytes after it really are that encoding.

    A UTF-8 mark is always one. A UTF-16/32 mark is trusted only when the rest is empty or holds a
    NUL byte (every UTF-16/32 text with a line end or an ASCII character does; UTF-8 text never
    does), or else when the rest is not UTF-8 but does decode as the marked encoding. Bytes FF FE
    never occur in UTF-8, and a UTF-8 file that happens to start with them (a stray pair of bytes)
    read as UTF-16 would be one garbled line: such a file is UTF-8 whose first line is undecodable.
    """
    for bom, encoding in BOMS:
        if data.startswith(bom):
            break
    else:
        return "utf-8", 0
    body = data[len(bom):]
    if encoding == "utf-8" or not body or b"\x00" in body:
        return encoding, len(bom)
    for candidate, mark_length in (("utf-8", 0), (encoding, len(bom))):
        try:
            body.decode(candidate)
        except UnicodeDecodeError:
            continue
        return candidate, mark_length
    return "utf-8", 0


def decode_user_text(data: bytes, name: str) -> str:
    """Text a user handed us: UTF-8, or UTF-16/32 recognised by its byte-order mark
    (:func:`text_encoding`).

    The mark is dropped. Bytes that are not valid in that encoding are a UserError
    naming the line, never a traceback or silently garbled text.
    """
    encoding, mark_length = text_encoding(data)
    data = data[mark_length:]
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        line = data[:err.start].count("\n".encode(encoding)) + 1
        raise UserError(f"{name} is not {encoding.upper()} text (line {line}): convert it to UTF-8") from None


def read_user_lines(path, name=None):
    """Lines (newline-stripped) of a user's text file; see :func:`decode_user_text`."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        raise UserError(f"file not found: {path}") from None
    # A pipe (bash's <(...)) is read once, like stdin; a directory or a device is no text file.
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise UserError(f"{path} is not a text file (a directory or a device)")
    text = decode_user_text(path.read_bytes(), name or str(path))
    return split_lines(text)


def read_regular_file(path, max_bytes: int, what: str, error=UserError, kind: str = None) -> bytes:
    """The bytes of a file a user names that must be a regular file of at most ``max_bytes``
    (a JSON profile, a runs.json): a pipe would block, a device (/dev/zero) never end.
    Problems are ``error`` naming ``what`` and the path (``kind``: what no real one exceeds)."""
    path = Path(path)
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise error(f"{what} {path} is not a regular file")
            data = handle.read(max_bytes + 1)
    except IsADirectoryError:
        raise error(f"{what} {path} is not a regular file") from None
    except OSError as err:
        raise error(f"{what} {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise error(f"{what} {path} is larger than {max_bytes} bytes, more than any {kind or what} needs")
    return data


def split_lines(text: str):
    """Lines at ``\\n`` only (str.splitlines also splits at form feeds, U+2028... inside a sentence)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


# --- options given twice ----------------------------------------------------------------------

def refuse_repeated_options(parser):
    """Make every single-valued option of ``parser`` refuse a second, different value.

    argparse keeps the last of ``--out A --out B`` (or ``--lowercase --no-lowercase``) and
    drops the first without a word; here that is ``PROG: error: argument --out: given twice
    with different values (A, then B): give it once``. The same value twice is harmless and
    accepted; options that collect several values (``nargs='+'`` with ``extend``) are untouched.
    """
    for action in parser._actions:
        if isinstance(action, (argparse._StoreAction, argparse._StoreConstAction, argparse.BooleanOptionalAction)):
            action.__class__ = _given_once(type(action))
    return parser


_ONCE_CLASSES = {}


def _given_once(action_class):
    if action_class not in _ONCE_CLASSES:
        def __call__(self, parser, namespace, values, option_string=None):
            action_class.__call__(self, parser, namespace, values, option_string)
            value = getattr(namespace, self.dest)
            given = self.__dict__.setdefault("_given", {})  # per parse, keyed by its namespace while it lives
            key = id(namespace)
            if key not in given:
                given[key] = (option_string, value)
                weakref.finalize(namespace, given.pop, key, None)
            elif given[key][1] != value:
                (first, before), shown = given[key], self.nargs != 0  # flags without a value: their names say it
                raise argparse.ArgumentError(
                    self, f"given twice with different values ({first}{_shown(before) if shown else ''}, then "
                          f"{option_string}{_shown(value) if shown else ''}): give it once")

        _ONCE_CLASSES[action_class] = type(action_class.__name__, (action_class,), {"__call__": __call__})
    return _ONCE_CLASSES[action_class]


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return " " + " ".join(str(item) for item in value)
    return f" {value}"
