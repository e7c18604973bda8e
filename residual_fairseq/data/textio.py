"""Reading and writing line-aligned text, with counted skips.

Lines are read as bytes and decoded one by one, so a single bad byte costs one
line (counted as ``non_utf8``) instead of the whole file. A file that starts with a
UTF-16 or UTF-32 byte-order mark is decoded as such (read line by line as UTF-8,
its NUL-padded bytes would pass as garbled text); a UTF-8 byte-order mark is dropped.
"""
import gzip
import io
from pathlib import Path

from ..argtypes import BOMS
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
            encoding = next((name for bom, name in BOMS if start.startswith(bom)), None)
            if encoding not in (None, "utf-8"):
                return _read_wide(start + handle.read(), encoding, path)
            handle.seek(3 if encoding == "utf-8" else 0)
            for raw in handle:
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError:
                    lines.append(UNDECODABLE)
    except (EOFError, OSError, gzip.BadGzipFile) as exc:
        if isinstance(exc, FileNotFoundError):
            raise DataPreparationError(f"input file not found: {path}") from None
        raise DataPreparationError(f"cannot read {path}: corrupt or truncated ({exc})") from None
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

    def __init__(self):
        self.counts = {}

    def add(self, reason, number=1):
        if number:
            self.counts[reason] = self.counts.get(reason, 0) + number

    def as_dict(self):
        return dict(sorted(self.counts.items()))


def pair_up(source_lines, target_lines, skips, source_name="source", target_name="target", drop_empty=True):
    """Zip two sides, requiring equal length; drop pairs with an undecodable (or empty) side.

    Returns two aligned lists. Mismatched lengths are an error, never a skip:
    they mean the files are not parallel and any pairing would be wrong.
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
    return kept_source, kept_target


def read_tsv_pairs(path, skips, source_column=0, target_column=1):
    """Pairs from a TSV file; rows with too few columns are counted as ``bad_tsv_row``."""
    sources, targets = [], []
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
        if len(fields) <= max(source_column, target_column):
            skips.add("bad_tsv_row")
            continue
        sources.append(fields[source_column])
        targets.append(fields[target_column])
    return sources, targets
