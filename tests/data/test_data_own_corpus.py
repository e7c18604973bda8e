"""Your own corpus (plain files, TSV, reuse of a trained model's subwords/dictionary) and the bundled sample."""
import gzip
import re
from pathlib import Path

import pytest

from residual_fairseq.data import PrepareOptions, prepare, prepare_sample_corpus
from residual_fairseq.resources import shipped_dir
from helpers.data_builders import numbered_pair, write_plain_pair, write_tsv

SAMPLE_DIR = shipped_dir("sample-es-en")
MARKUP = re.compile(r"[<>]|strong:[HG]?[0-9]|lemma=")
SAMPLE_COUNTS = {"train": 28963, "valid": 1030, "test": 1091}  # as in data/sample-es-en/README.md


def lines_of(path):
    return Path(path).read_text("utf-8").splitlines()


def custom(tmp_path, name="out", **settings):
    settings.setdefault("vocab_size", 60)
    return prepare(PrepareOptions(dataset="custom", out=tmp_path / name, source_lang="de", target_lang="en",
                                  progress=False, **settings))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    extra = [(b"", b"an empty source"), (b"kaputt \xff\xfe", b"broken bytes"), (b"x y", b"")]
    source, target = write_plain_pair(root / "input", 120, extra=extra)
    return root, prepare(PrepareOptions(dataset="custom", out=root / "out", source_lang="de", target_lang="en",
                                        train=[source, target], valid_size=10, test_size=12, vocab_size=60,
                                        progress=False))


def test_plain_files_hold_out_seeded_valid_and_test(plain):
    _, prepared = plain
    splits = prepared.manifest["splits"]
    assert (splits["train"]["pairs"], splits["valid"]["pairs"], splits["test"]["pairs"]) == (98, 10, 12)
    pieces = [set(lines_of(prepared.out_dir / "tok" / f"{split}.en")) for split in ("train", "valid", "test")]
    assert not (pieces[0] & pieces[1] or pieces[0] & pieces[2] or pieces[1] & pieces[2])
    assert (prepared.out_dir / "spm.model").is_file() and (prepared.bin_dir / "train.de-en.de.bin").is_file()


def test_empty_and_non_utf8_lines_are_counted_skips(plain):
    _, prepared = plain
    assert prepared.manifest["skipped"] == {"empty_line": 2, "non_utf8": 1}
    log = (prepared.out_dir / "prepare.log").read_text()
    assert "skipped 2 pair(s): empty_line" in log and "skipped 1 pair(s): non_utf8" in log


def test_tsv_with_given_valid_and_test(tmp_path):
    prepared = custom(tmp_path, train=[write_tsv(tmp_path / "train.tsv", 1, 80)],
                      valid=[write_tsv(tmp_path / "valid.tsv", 200, 5)], test=[write_tsv(tmp_path / "test.tsv", 300, 6)],
                      tokenizer="moses", subword="bpe", vocab_size=20)
    assert lines_of(prepared.out_dir / "tok" / "test.de")[0] == numbered_pair(300)[0][:-1] + " ."
    assert prepared.manifest["splits"]["valid"]["pairs"] == 5 and (prepared.out_dir / "bpe.codes").is_file()


def test_reuse_keeps_the_subword_model_and_dictionary(tmp_path, plain):
    _, first = plain
    source, target = write_plain_pair(tmp_path / "new", 40, stem="new")
    second = custom(tmp_path, train=[source, target], valid_size=4, test_size=4, reuse=first.out_dir)
    assert (second.bin_dir / "dict.de.txt").read_bytes() == (first.bin_dir / "dict.de.txt").read_bytes()
    assert (second.out_dir / "spm.model").read_bytes() == (first.out_dir / "spm.model").read_bytes()
    assert second.manifest["subword"]["reused_from"] == str(first.out_dir / "spm.model")
    # The same, spelled out with explicit files.
    third = custom(tmp_path, "third", train=[source, target], valid_size=4, test_size=4,
                   subword_model=first.out_dir / "spm.model", srcdict=first.bin_dir / "dict.de.txt")
    assert (third.bin_dir / "dict.en.txt").read_bytes() == (first.bin_dir / "dict.de.txt").read_bytes()
    assert lines_of(third.out_dir / "train.de") == lines_of(second.out_dir / "train.de")


def read_sample_split(split):
    with gzip.open(SAMPLE_DIR / f"{split}.tsv.gz", "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n").split("\t") for line in handle]


def test_sample_corpus_counts_alignment_and_disjoint_splits():
    rows = {split: read_sample_split(split) for split in SAMPLE_COUNTS}
    assert {split: len(lines) for split, lines in rows.items()} == SAMPLE_COUNTS
    for lines in rows.values():
        assert all(len(row) == 3 and row[1].strip() and row[2].strip() for row in lines)  # ref, es, en
        assert not any(MARKUP.search(row[1] + row[2]) for row in lines)  # no OSIS tags, no Strong's numbers
    books = {split: {row[0].rsplit(" ", 1)[0] for row in lines} for split, lines in rows.items()}
    assert books["test"] == {"Acts", "Ruth"} and books["valid"] == {"John", "Phil", "Jonah"}
    assert not books["train"] & (books["test"] | books["valid"])
    references = [row[0] for lines in rows.values() for row in lines]
    assert len(references) == len(set(references))


@pytest.mark.slow
def test_sample_corpus_prepares_offline_and_reruns_as_a_no_op(tmp_path):
    bin_dir = prepare_sample_corpus(tmp_path / "sample", workers=2, vocab_size=2000)
    for split, count in SAMPLE_COUNTS.items():
        assert len(lines_of(tmp_path / "sample" / f"{split}.es")) == count
        assert len(lines_of(tmp_path / "sample" / f"{split}.en")) == count
        assert (bin_dir / f"{split}.es-en.es.bin").is_file()
    before = (tmp_path / "sample" / "manifest.json").stat().st_mtime_ns
    again = prepare(PrepareOptions(dataset="sample-es-en", out=tmp_path / "sample", vocab_size=2000, workers=2))
    assert again.reused and (tmp_path / "sample" / "manifest.json").stat().st_mtime_ns == before
