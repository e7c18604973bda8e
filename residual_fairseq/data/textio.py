"""Reading and writing line-aligned text, with counted skips.

Lines are read as bytes and decoded one by one, so a single bad byte costs one
line (counted as ``non_utf8``) instead of the whole file. A file that starts with a
UTF-16 or UTF-32 byte-order mark is decoded as such when it really is that encoding
(:func:`residual_fairseq.argtypes.text_encoding`: read line by line as UTF-8, its
NUL-padded bytes would pass as garbled text; a UTF-8 file that merely starts with the
bytes FF FE stays UTF-8, its first line undecodable); a UTF-8 byte-order mark is dropped.
Damaged compressed data (a truncated or corrupt ``.gz``) is one error naming the file.
"""
import gzip
import io
import zlib
from pathlib import Path

from ..argtypes import BOMS, text_encoding
from .errors import DataPreparationError

# A line that is not valid UTF-8 is represented by None until the pair it
# belongs to is dropped; keeping the slot keeps the two sides aligned.
UNDECODABLE = None


def open_binary(path):
    path = Path(path)
    if not path.is_file():
        raise DataPreparationError(f"input file not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_lines(path):
    """All lines of a (possibly .gz) text file, newline-stripped; undecodable lines are None."""
    lines = []
    try:
        with open_binary(path) as handle:
            start = handle.read(4)
            if any(start.startswith(bom) for bom, name in BOMS if name != "utf-8"):
                # Whether the mark tells the truth depends on all the bytes after it.
                data = start + handle.read()
                encoding, _ = text_encoding(data)
                if encoding != "utf-8":
                    return _read_wide(data, encoding, path)
                return [_decode_line(raw) for raw in _split_at_newlines(data)]
            handle.seek(text_encoding(start)[1])  # past a UTF-8 mark
            for raw in handle:
                lines.append(_decode_line(raw))
    except (EOFError, OSError, zlib.error) as exc:  # (gzip.BadGzipFile is an OSError)
        if isinstance(exc, FileNotFoundError):
            raise DataPreparationError(f"input file not found: {path}") from None
        raise DataPreparationError(f"cannot read {path}: corrupt or truncated ({exc})") from None
    return lines


def _decode_line(raw):
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        return UNDECODABLE


def _split_at_newlines(data):
    """The lines of ``data`` as iterating over a binary file gives them (at ``\\n`` only)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _read_wide(data, encoding, path):
    """A whole UTF-16/32 file (byte-order mark first), decoded; undecodable lines are None."""
    bom = next(bom for bom, name in BOMS if name == encoding)
    newline = "\n".encode(encoding)
    width = len(newline)
    lines, start, body = [], len(bom), data
    while start < len(body):
        end = start
        while end < len(body):  # the next newline on a code-unit boundary
            end = body.find(newline, end)
            if end < 0 or (end - start) % width == 0:
                break
            end += 1
        end = len(body) if end < 0 else end
        try:
            lines.append(body[start:end].decode(encoding).rstrip("\r"))
        except UnicodeDecodeError:
            lines.append(UNDECODABLE)
        start = end + width
    return lines


def write_lines(path, lines):
    """One line per item. A carriage return inside an item becomes a space: fairseq-preprocess and
    the scorers read text with universal newlines, where a lone ``\\r`` ends a line, so one side of
    a pair would gain a sentence and every later pair would be misaligned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with io.open(path, "w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(line.replace("\r", " "))
            handle.write("\n")


class SkipCounter:
    """Counts dropped sentence pairs by reason; ends up in the manifest and log."""

    # What each reason means, for messages that say how much was dropped and why.
    MEANINGS = {"non_utf8": "not UTF-8", "empty_line": "with an empty side",
                "bad_tsv_row": "TSV rows with too few columns", "clean_length": "too short or too long",
                "clean_ratio": "over the length ratio"}

    def __init__(self):
        self.counts = {}

    def add(self, reason, number=1):
        if number:
            self.counts[reason] = self.counts.get(reason, 0) + number

    def as_dict(self):
        return dict(sorted(self.counts.items()))

    def describe(self):
        """How many were dropped and why, in words: ``12 dropped: 10 with an empty side, 2 not UTF-8``."""
        if not self.counts:
            return "none dropped"
        reasons = ", ".join(f"{count} {self.MEANINGS.get(reason, reason)}"
                            for reason, count in sorted(self.counts.items(), key=lambda item: -item[1]))
        return f"{sum(self.counts.values())} dropped: {reasons}"


def pair_up(source_lines, target_lines, skips, source_name="source", target_name="target", drop_empty=True):
    """Zip two sides, requiring equal length; drop pairs with an undecodable (or empty) side.

    Returns two aligned lists. Mismatched lengths are an error, never a skip:
    they mean the files are not parallel and any pairing would be wrong. So is
    dropping every pair: the error says which side is empty or undecodable.
    ``drop_empty=False`` keeps empty pairs for a later clean-corpus-n step, so
    that every-Nth-line splits see the original numbering.
    """
    if len(source_lines) != len(target_lines):
        raise DataPreparationError(
            f"line counts differ: {source_name} has {len(source_lines)} lines, "
            f"{target_name} has {len(target_lines)}"
        )
    kept_source, kept_target = [], []
    for src, tgt in zip(source_lines, target_lines):
        if src is UNDECODABLE or tgt is UNDECODABLE:
            skips.add("non_utf8")
            continue
        if drop_empty and (not src.strip() or not tgt.strip()):
            skips.add("empty_line")
            continue
        kept_source.append(src)
        kept_target.append(tgt)
    if source_lines and not kept_source:
        raise DataPreparationError(f"no pair left of {source_name} and {target_name}: "
                                   + _why_nothing_is_left(source_lines, target_lines, source_name, target_name))
    return kept_source, kept_target


def _why_nothing_is_left(source_lines, target_lines, source_name, target_name):
    """Why every pair was dropped: a side with only empty or undecodable lines, or both together."""
    total = len(source_lines)
    for lines, name in ((source_lines, source_name), (target_lines, target_name)):
        undecodable = sum(line is UNDECODABLE for line in lines)
        if undecodable == total:
            return f"{name} is not UTF-8 text (all {total} lines undecodable)"
        if all(line is UNDECODABLE or not line.strip() for line in lines):
            return f"{name} has only empty lines " + (
                f"({total - undecodable} empty and {undecodable} not UTF-8, of {total})" if undecodable
                else f"(all {total} lines)")
    undecodable = sum(src is UNDECODABLE or tgt is UNDECODABLE for src, tgt in zip(source_lines, target_lines))
    return (f"each of the {total} pairs has an empty or non-UTF-8 side "
            f"({total - undecodable} with an empty side, {undecodable} not UTF-8)")


def read_tsv_pairs(path, skips, source_column=0, target_column=1, flag=None):
    """Pairs from a TSV file; rows with too few columns are counted as ``bad_tsv_row``.

    A file where no row has the columns asked for is an error that says how many columns
    its rows have (``flag``: the option that chose the columns, for the message).
    """
    sources, targets = [], []
    widths = set()
    for line in read_lines(path):
        if line is UNDECODABLE:
            sources.append(UNDECODABLE)
            targets.append(UNDECODABLE)
            continue
        if not line.strip():
            sources.append("")
            targets.append("")
            continue
        fields = line.split("\t")
        widths.add(len(fields))
        if len(fields) <= max(source_column, target_column):
            skips.add("bad_tsv_row")
            continue
        sources.append(fields[source_column])
        targets.append(fields[target_column])
    if widths and max(widths) <= max(source_column, target_column):
        has = f"{min(widths)} to {max(widths)}" if len(widths) > 1 else f"{max(widths)}"
        asked = (f"{flag} {source_column},{target_column} asks for columns {source_column} and {target_column}"
                 if flag else f"columns {source_column} and {target_column} are read")
        raise DataPreparationError(f"TSV file {path} has {has} tab-separated column(s) per row, but {asked} "
                                   "(counted from 0): no row has them")
    return sources, targets
