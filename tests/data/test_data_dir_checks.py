"""A broken binarized data directory is one line before fairseq reads it
(residual_fairseq.data.binarized), in every tool that hands a data dir to fairseq.

Without the checks each case below is a traceback from inside fairseq-train or
fairseq-generate (a token id beyond the dictionary: an embedding IndexError once
training has started).
"""
import re
import shutil

import pytest

import residual_fairseq  # noqa: F401
from helpers import user_error
from residual_fairseq import analysis, evaluate, train
from residual_fairseq.data import binarized
from residual_fairseq.errors import UserError

SPLITS = ("train", "valid", "test")


def _copy(toy_data_bin, out):
    shutil.copytree(toy_data_bin, out)
    return out


def _each_split(data, side, change):
    for split in SPLITS:
        change(data / f"{split}.src-tgt.{side}")


def _truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


# name -> (how to break a copy of the toy data dir, what the one line must say)
CASES = {
    "dictionary line without a count": (
        lambda d: (d / "dict.tgt.txt").write_text("w1 1\nbroken\n"),
        r"dict\.tgt\.txt is not a fairseq dictionary: Incorrect dictionary format"),
    "dictionary not UTF-8": (
        lambda d: (d / "dict.src.txt").write_bytes(b"\xff\xfe w 1\n"),
        r"dict\.src\.txt is not a fairseq dictionary \(not UTF-8 text\)"),
    "index truncated": (
        lambda d: _each_split(d, "src", lambda p: _truncate(p.with_suffix(p.suffix + ".idx"), 40)),
        r"src\.idx is truncated or corrupt"),
    "index not fairseq's": (
        lambda d: _each_split(d, "tgt", lambda p: p.with_suffix(p.suffix + ".idx").write_bytes(b"PK\x03\x04" * 20)),
        r"tgt\.idx is not a fairseq binarized index"),
    "data file truncated": (
        lambda d: _each_split(d, "tgt", lambda p: _truncate(p.with_suffix(p.suffix + ".bin"), 10)),
        r"tgt\.bin holds 10 bytes but its index describes \d+ tokens"),
    "data file missing": (
        lambda d: _each_split(d, "src", lambda p: p.with_suffix(p.suffix + ".bin").unlink()),
        r"src\.bin is missing"),
    "token ids beyond the dictionary": (
        lambda d: [(d / f"dict.{side}.txt").write_text("w1 1\n") for side in ("src", "tgt")],
        r"src\.bin holds token id \d+, outside its dictionary's 5 symbols"),
    "sides not parallel": (
        lambda d: [shutil.copy(d / f"{source}.src-tgt.tgt.{ext}", d / f"{split}.src-tgt.tgt.{ext}")
                   for source, split in (("train", "test"), ("valid", "train")) for ext in ("bin", "idx")],
        r"src\.bin has \d+ sentences but .*tgt\.bin has \d+: the two sides of a split must be parallel"),
}


@pytest.fixture(scope="module")
def broken(toy_data_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("broken_data")
    dirs = {}
    for index, (name, (breaking, _)) in enumerate(CASES.items()):
        dirs[name] = _copy(toy_data_bin, root / f"case{index}")
        breaking(dirs[name])
    return dirs


def test_a_good_data_dir_passes(toy_data_bin):
    counts = binarized.check_translation_data(toy_data_bin, "src", "tgt", SPLITS, shared_embeddings=True)
    assert counts == {"train": 600, "valid": 40, "test": 40}
    assert binarized.check_split(toy_data_bin, "test") == 40


@pytest.mark.parametrize("case", list(CASES))
def test_broken_data_dirs_are_one_line_in_every_tool(case, broken, trained_tiny, capsys, tmp_path):
    data, expected = broken[case], CASES[case][1]
    with pytest.raises(UserError, match=expected):
        binarized.check_translation_data(data, "src", "tgt")
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "2",
                                               "--data", data, "--save-dir", tmp_path / "ck", "--dry-run"])
    assert re.search("^error: .*" + expected, line), line
    assert not (tmp_path / "ck").exists()
    _, save_dir, _ = trained_tiny
    line = user_error(capsys, evaluate.main, [save_dir / "checkpoint_last.pt", data, "--out-json",
                                                  tmp_path / "eval.json"])
    assert re.search("^error: ", line) and not (tmp_path / "eval.json").exists(), line
    line = user_error(capsys, analysis.main, [data, "--out", tmp_path / "analysis", "--layers", "2"])
    assert re.search("^error: .*" + expected, line), line


def test_evaluate_checks_the_split_it_scores(broken, trained_tiny, capsys, tmp_path):
    _, save_dir, _ = trained_tiny
    line = user_error(capsys, evaluate.main, [save_dir / "checkpoint_last.pt", broken["sides not parallel"],
                                                  "--out-json", tmp_path / "eval.json"])
    assert re.search(r"test\.src-tgt\.src\.bin has 40 sentences but .*test\.src-tgt\.tgt\.bin has", line), line


def test_a_shared_embedding_model_needs_one_joined_dictionary(toy_data_bin, capsys, tmp_path):
    data = _copy(toy_data_bin, tmp_path / "data")
    with open(data / "dict.tgt.txt", "a") as dictionary:
        dictionary.write("only_in_target 1\n")
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "2",
                                               "--data", data, "--save-dir", tmp_path / "ck", "--dry-run"])
    assert "dict.src.txt and dict.tgt.txt" in line and "--joined-dictionary" in line


def test_the_splits_fairseq_train_will_read(toy_data_bin, capsys, tmp_path):
    """train and valid by default; --valid-subset and --disable-validation change which."""
    data = _copy(toy_data_bin, tmp_path / "data")
    for ext in ("bin", "idx"):
        for side in ("src", "tgt"):
            (data / f"valid.src-tgt.{side}.{ext}").unlink()
    base = ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "2", "--data", str(data),
            "--save-dir", str(tmp_path / "ck"), "--dry-run"]
    assert "no 'valid' split for src-tgt" in user_error(capsys, train.main, base)
    assert train.main(base + ["--", "--disable-validation"]) in (None, 0)
    assert train.main(base + ["--", "--valid-subset", "test"]) in (None, 0)
    assert "no 'dev' split" in user_error(capsys, train.main, base + ["--", "--valid-subset=test,dev"])


def test_language_model_data(toy_data_bin, tmp_path):
    data = tmp_path / "lm"
    data.mkdir()
    shutil.copy(toy_data_bin / "dict.src.txt", data / "dict.txt")
    for split in SPLITS:
        for ext in ("bin", "idx"):
            shutil.copy(toy_data_bin / f"{split}.src-tgt.src.{ext}", data / f"{split}.{ext}")
    assert binarized.check_language_model_data(data, SPLITS) == {"train": 600, "valid": 40, "test": 40}
    assert binarized.check_split(data, "test") == 40
    (data / "dict.txt").write_text("w1 1\n")
    with pytest.raises(UserError, match=r"train\.bin holds token id \d+, outside its dictionary's 5 symbols"):
        binarized.check_language_model_data(data)


def test_a_colon_in_the_data_path_is_one_line(toy_data_bin, trained_tiny, capsys, tmp_path):
    """fairseq would read a:b/bin as the two directories 'a' and 'b/bin' (a traceback)."""
    data = _copy(toy_data_bin, tmp_path / "a:b" / "bin")
    expected = r"^error: data directory .*a:b/bin has ':' in its path, which fairseq reads as a list of directories"
    line = user_error(capsys, train.main, ["--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "2",
                                           "--data", data, "--save-dir", tmp_path / "ck", "--dry-run"])
    assert re.search(expected, line), line
    _, save_dir, _ = trained_tiny
    line = user_error(capsys, evaluate.main, [save_dir / "checkpoint_last.pt", data])
    assert re.search(expected, line), line
    line = user_error(capsys, analysis.main, [data, "--out", tmp_path / "analysis", "--layers", "2"])
    assert re.search(expected, line), line
    with pytest.raises(UserError, match="has ':' in its path"):
        binarized.check_language_model_data(data)
