"""Checks of a binarized data directory (fairseq-preprocess output) before fairseq reads it.

fairseq trusts its data directory. A dictionary line without a count, a truncated
``.idx``, a ``.bin`` shorter than its index says, a source side with more sentences
than the target side, or token ids beyond the dictionary all end in a traceback from
deep inside fairseq-train or fairseq-generate, the last one as an embedding
``IndexError`` after training has started. These checks read the dictionaries with
fairseq's own parser, the index headers, and each ``.bin`` once (a numpy min/max over
the memory-mapped token ids), and report each problem in one line.

Only fairseq's default ``mmap`` format (what ``residual-fairseq-prepare`` and
``fairseq-preprocess`` write) is checked in depth; a split stored in another fairseq
format (``raw``, ``cached``...) is left to fairseq.
"""
import os
import re
import struct
from pathlib import Path

import numpy as np

from ..errors import UserError

MMAP_MAGIC = b"MMIDIDX\x00\x00"          # fairseq.data.indexed_dataset.MMapIndexedDataset.Index
MMAP_HEADER = struct.Struct("<9sQBQ")    # magic, version (1), dtype code, number of sentences
TOKEN_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,  # fairseq's _code_to_dtype,
                8: np.uint16, 9: np.uint32, 10: np.uint64}                       # integer codes only


def check_unsplit_path(data) -> None:
    """fairseq reads ``:`` in a data path as a list of directories (``a:b`` = ``a`` and ``b``)."""
    if os.pathsep in str(data):
        raise UserError(f"data directory {data} has '{os.pathsep}' in its path, which fairseq reads as a list of "
                        f"directories: rename it, or pass a symlink to it without '{os.pathsep}'")


def dictionary_size(path) -> int:
    """The number of symbols of a fairseq dictionary file, read with fairseq's own parser."""
    from fairseq.data import Dictionary

    path = Path(path)
    if not path.is_file():
        raise UserError(f"dictionary not found: {path}")
    try:
        path.read_bytes().decode("utf-8")  # (fairseq's own message for this names the file twice)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a fairseq dictionary (not UTF-8 text)") from None
    try:
        return len(Dictionary.load(str(path)))
    except Exception as err:  # fairseq raises ValueError/RuntimeError quoting the offending line
        detail = str(err).strip().replace("\r", "\\r").replace("\n", "\\n")  # its newline too: keep one line
        if detail.startswith("Duplicate word found"):  # (fairseq's advice goes on about Camembert)
            detail = detail.split(". ", 1)[0] + ": a symbol may appear once, or its line ends in #fairseq:overwrite"
        raise UserError(f"{path} is not a fairseq dictionary: {detail}") from None


SENTENCEPIECE_MARK = "\u2581"


def dictionary_segmentation(dictionary, threshold: float = 0.1):
    """(method, marked entries, entries): ``"sentencepiece"`` when at least ``threshold`` of the
    dictionary's entries carry the ``▁`` word-start mark, ``"subword_nmt"`` when they end in ``@@``,
    else None. How evaluate and translate tell a dictionary of subword units."""
    entries = spm = bpe = 0
    try:
        lines = Path(dictionary).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None, 0, 0
    for line in lines:
        token = line.split(" ", 1)[0]
        if not token or token.startswith("#fairseq:"):
            continue
        entries += 1
        spm += token.startswith(SENTENCEPIECE_MARK)
        bpe += token.endswith("@@")
    if entries and spm >= threshold * entries:
        return "sentencepiece", spm, entries
    if entries and bpe >= threshold * entries:
        return "subword_nmt", bpe, entries
    return None, 0, entries


def check_dictionaries(data) -> dict:
    """Every dictionary of a data directory (``dict.txt``, ``dict.<lang>.txt``): {file name: size}."""
    check_unsplit_path(data)
    paths = sorted(Path(data).glob("dict.*.txt")) + ([Path(data) / "dict.txt"] if Path(data, "dict.txt").exists() else [])
    return {path.name: dictionary_size(path) for path in paths}


def check_mmap_split(prefix, vocab_size: int) -> int:
    """Check ``prefix.idx`` / ``prefix.bin`` (fairseq's mmap format) against a vocabulary of
    ``vocab_size`` symbols; returns the number of sentences."""
    index_path, data_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    for path in (index_path, data_path):
        if not path.is_file():
            raise UserError(f"{path} is missing (each binarized split is a .idx and a .bin file)")
    index = index_path.read_bytes()
    if len(index) < MMAP_HEADER.size or not index.startswith(MMAP_MAGIC):
        raise UserError(f"{index_path} is not a fairseq binarized index (truncated, or not written by "
                        f"fairseq-preprocess)")
    _, version, dtype_code, count = MMAP_HEADER.unpack_from(index)
    if version != 1 or dtype_code not in TOKEN_DTYPES:
        raise UserError(f"{index_path}: unsupported index (version {version}, token type code {dtype_code})")
    if len(index) != MMAP_HEADER.size + count * 12:  # int32 size and int64 offset per sentence
        raise UserError(f"{index_path} is truncated or corrupt: {len(index)} bytes for {count} sentences "
                        f"(expected {MMAP_HEADER.size + count * 12})")
    dtype = np.dtype(TOKEN_DTYPES[dtype_code])
    sizes = np.frombuffer(index, dtype="<i4", count=count, offset=MMAP_HEADER.size).astype(np.int64)
    pointers = np.frombuffer(index, dtype="<i8", count=count, offset=MMAP_HEADER.size + 4 * count)
    expected_pointers = (np.cumsum(sizes) - sizes) * dtype.itemsize
    if (sizes < 0).any() or not np.array_equal(pointers, expected_pointers):
        raise UserError(f"{index_path} is corrupt: its sentence sizes and offsets disagree")
    tokens = int(sizes.sum())
    if data_path.stat().st_size != tokens * dtype.itemsize:
        raise UserError(f"{data_path} holds {data_path.stat().st_size} bytes but its index describes "
                        f"{tokens} tokens of {dtype.itemsize} bytes: truncated or from another binarization")
    if tokens:
        ids = np.memmap(data_path, dtype=dtype, mode="r")
        lowest, highest = int(ids.min()), int(ids.max())
        del ids
        if lowest < 0 or highest >= vocab_size:
            raise UserError(f"{data_path} holds token id {highest if highest >= vocab_size else lowest}, outside "
                            f"its dictionary's {vocab_size} symbols: the .bin and the dict do not belong together")
    return count


def split_prefixes(data, split: str, suffix: str = ""):
    """fairseq's files for ``split``: ``data/split<suffix>``, then its shards ``split1<suffix>``,
    ``split2<suffix>``... (fairseq's ``combine`` loading), as long as they exist."""
    prefixes, shard = [], 0
    while True:
        prefix = Path(data) / f"{split}{shard or ''}{suffix}"
        if not (Path(f"{prefix}.idx").exists() or Path(f"{prefix}.bin").exists() or prefix.exists()):
            return prefixes
        prefixes.append(prefix)
        shard += 1


def _split_size(prefix, vocab_size):
    """Sentences in one file of a split; None when it is not in the mmap format (left to fairseq)."""
    index_path = Path(f"{prefix}.idx")
    if index_path.is_file():
        with open(index_path, "rb") as stream:
            magic = stream.read(len(MMAP_MAGIC))
        if magic[:6] in (b"TNTIDX", b"HUFFID"):
            return None  # fairseq's other binary formats
    elif Path(prefix).is_file() and not Path(f"{prefix}.bin").exists():
        return None  # fairseq's raw text format
    return check_mmap_split(prefix, vocab_size)


_BINARY_PAIR = re.compile(r"^train\d*\.([^.\-]+)-([^.\-]+)\.[^.]+\.(bin|idx)$")


def data_language_pairs(data) -> list:
    """The (source, target) pairs of a fairseq data directory's train files, as binarized."""
    return sorted({match.groups()[:2] for match in map(_BINARY_PAIR.match, os.listdir(data)) if match})


def language_pair(data, source_lang=None, target_lang=None, configured=(None, None)):
    """The (source, target) to train or read: -s/-t if given, else the config's pair when the
    data hold it, else the data's one pair. Either direction of a binarized pair is trainable."""
    pairs = data_language_pairs(data)
    if not pairs:
        raise UserError(f"{data} holds no training data (train.SRC-TGT.LANG.bin): pass the prepared bin/ directory")
    directions = pairs + [(tgt, src) for src, tgt in pairs if (tgt, src) not in pairs]
    shown = ", ".join(f"{src}-{tgt}" for src, tgt in pairs)
    if source_lang or target_lang:
        matching = [(src, tgt) for src, tgt in directions
                    if source_lang in (None, src) and target_lang in (None, tgt)]
        if len(matching) != 1:
            asked = f"{source_lang or '?'}->{target_lang or '?'}"
            raise UserError(f"-s/-t {asked}: {data} holds {shown}" + ("" if matching else " (no such pair)"))
        return matching[0]
    if None not in configured and tuple(configured) in directions:
        return tuple(configured)
    if len(pairs) == 1:
        return pairs[0]
    raise UserError(f"{data} holds several language pairs ({shown}): choose one with -s/-t")


def check_translation_data(data, source_lang: str, target_lang: str, splits=("train", "valid"),
                           shared_embeddings: bool = False) -> dict:
    """Check the dictionaries and ``splits`` of a translation data directory for one
    direction; returns {split: number of sentence pairs}."""
    check_unsplit_path(data)
    data = Path(data)
    sizes = {lang: dictionary_size(data / f"dict.{lang}.txt") for lang in (source_lang, target_lang)}
    if shared_embeddings and (data / f"dict.{source_lang}.txt").read_bytes() != (
            data / f"dict.{target_lang}.txt").read_bytes():
        raise UserError(f"dict.{source_lang}.txt and dict.{target_lang}.txt in {data} differ, but this model shares "
                        f"all embeddings between source and target: binarize with one joined dictionary "
                        f"(residual-fairseq-prepare does; fairseq-preprocess --joined-dictionary)")
    counts = {}
    for split in splits:
        for pair in (f"{source_lang}-{target_lang}", f"{target_lang}-{source_lang}"):
            sides = {lang: split_prefixes(data, split, f".{pair}.{lang}") for lang in (source_lang, target_lang)}
            if sides[source_lang] or sides[target_lang]:
                break
        else:
            raise UserError(f"no '{split}' split for {source_lang}-{target_lang} in {data} "
                            f"(expected {split}.{source_lang}-{target_lang}.{source_lang}.bin/.idx)")
        if len(sides[source_lang]) != len(sides[target_lang]):
            raise UserError(f"the '{split}' split in {data} has {len(sides[source_lang])} {source_lang} file(s) "
                            f"but {len(sides[target_lang])} {target_lang} file(s)")
        total = 0
        for source_prefix, target_prefix in zip(sides[source_lang], sides[target_lang]):
            source_count = _split_size(source_prefix, sizes[source_lang])
            target_count = _split_size(target_prefix, sizes[target_lang])
            if None not in (source_count, target_count) and source_count != target_count:
                raise UserError(f"{source_prefix}.bin has {source_count} sentences but {target_prefix}.bin has "
                                f"{target_count}: the two sides of a split must be parallel")
            total += source_count or 0
        counts[split] = total
    return counts


def check_language_model_data(data, splits=("train", "valid")) -> dict:
    """Check ``dict.txt`` and ``splits`` of a language-model data directory; returns
    {split: number of lines}."""
    check_unsplit_path(data)
    data = Path(data)
    vocab_size = dictionary_size(data / "dict.txt")
    counts = {}
    for split in splits:
        prefixes = split_prefixes(data, split)
        if not prefixes:
            raise UserError(f"no '{split}' split in {data} (expected {split}.bin/.idx)")
        counts[split] = sum(_split_size(prefix, vocab_size) or 0 for prefix in prefixes)
    return counts


def check_split(data, split: str) -> int:
    """Check one split of a data directory as fairseq-generate / -eval-lm will read it:
    every language pair binarized for it (or the language-model split); returns its sentences."""
    data = Path(data)
    if (data / "dict.txt").is_file() and not any(data.glob("dict.*.txt")):
        return check_language_model_data(data, [split])[split]
    pattern = re.compile(rf"{re.escape(split)}\d*\.([^.\-]+)-([^.\-]+)\.[^.]+\.(bin|idx)$")
    pairs = sorted({match.groups()[:2] for match in map(pattern.match, os.listdir(data)) if match})
    if not pairs:
        raise UserError(f"no binarized '{split}' split in {data} (expected {split}.<src>-<tgt>.<lang>.bin)")
    return max(check_translation_data(data, source, target, [split])[split] for source, target in pairs)


def check_task_split(task, split: str) -> int:
    """:func:`check_split` for the data directory of a fairseq task (new-style ``cfg`` or legacy ``args``)."""
    return check_split((task.cfg if task.cfg is not None else task.args).data, split)
