"""Language-model data preparation: WikiText-103 recipe, the offline sample, your own text, bad input."""
import gzip
import json
import zipfile

import pytest

from helpers import fairseq_cli, run
from residual_fairseq.data.cli import main as prepare_main
from residual_fairseq.resources import shipped_dir

WIKI_LINES = {
    "train": [" ", " = Valkyria Chronicles III = ", " ", " Senjō no Valkyria 3 : <unk> Chronicles is a game . ",
              " The game began development in 2010 , carrying over a large portion of the work . ", " "],
    "valid": [" ", " = Homarus gammarus = ", " ", " Homarus gammarus is a species of <unk> lobster . "],
    "test": [" ", " = Robert <unk> = ", " ", " Robert <unk> is an English film and television actor . "],
}


def make_wikitext_archive(path, splits=WIKI_LINES, layout="wikitext-103/wiki.{split}.tokens"):
    """A miniature wikitext-103-v1.zip in the real layout (wikitext-103/wiki.*.tokens)."""
    with zipfile.ZipFile(path, "w") as archive:
        for split, lines in splits.items():
            archive.writestr(layout.format(split=split), "\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True)
def restore_data_logger():
    """The CLI adds a stderr handler per call; drop it so later tests' captures stay clean."""
    import logging

    logger = logging.getLogger("residual_fairseq.data")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def prepare(*args):
    return prepare_main([*args, "--quiet", "--workers", "1"])


def error_of(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        prepare(*args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0] and not any("Traceback" in line for line in err), err
    return errors[0]


def no_partial_output(out):
    assert not out.exists(), f"{out} was created"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "staging left behind"


@pytest.mark.slow
def test_wikitext103_recipe_equals_fairseqs_preprocess(tmp_path):
    archive = make_wikitext_archive(tmp_path / "wikitext-103-v1.zip")
    out = tmp_path / "wt103"
    prepare("--dataset", "wikitext-103", "--from-archive", str(archive), "--out", str(out))
    # fairseq's README: fairseq-preprocess --only-source on the unzipped files.
    unzipped = tmp_path / "unzipped"
    zipfile.ZipFile(archive).extractall(unzipped)
    text = unzipped / "wikitext-103"
    reference = tmp_path / "reference-bin"
    run([fairseq_cli("fairseq-preprocess"), "--only-source", "--trainpref", text / "wiki.train.tokens",
         "--validpref", text / "wiki.valid.tokens", "--testpref", text / "wiki.test.tokens",
         "--destdir", reference, "--workers", "1"])
    for name in ("dict.txt", "train.bin", "train.idx", "valid.bin", "test.bin", "test.idx"):
        assert (out / "bin" / name).read_bytes() == (reference / name).read_bytes(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "language_modeling" and manifest["subword"]["method"] == "none"
    assert manifest["splits"]["test"]["lines"] == len(WIKI_LINES["test"])
    assert manifest["sources"][0]["official"] is False  # not the published archive's sha256
    # A re-run with the same archive is a no-op.
    before = (out / "manifest.json").stat().st_mtime_ns
    prepare("--dataset", "wikitext-103", "--from-archive", str(archive), "--out", str(out))
    assert (out / "manifest.json").stat().st_mtime_ns == before


def test_wikitext103_download_is_checksummed():
    from residual_fairseq.data.language_modeling import LM_RECIPES, WIKITEXT103_SHA256

    (source,) = LM_RECIPES["wikitext-103"].sources
    assert source.sha256 == WIKITEXT103_SHA256 and source.name == "wikitext-103-v1.zip"
    assert any("research.metamind.io/wikitext/wikitext-103-v1.zip" in url for url in source.urls)


@pytest.mark.slow
def test_sample_lm_is_the_english_side_of_the_sample(tmp_path):
    out = tmp_path / "sample-lm"
    prepare("--dataset", "sample-lm", "--vocab-size", "500", "--out", str(out))
    import sentencepiece

    spm = sentencepiece.SentencePieceProcessor(model_file=str(out / "spm.model"))
    manifest = json.loads((out / "manifest.json").read_text())
    for split in ("train", "valid", "test"):
        with gzip.open(shipped_dir("sample-es-en") / f"{split}.tsv.gz", "rt", encoding="utf-8") as tsv:
            english = [line.rstrip("\n").split("\t")[2] for line in tsv]
        segmented = (out / f"{split}.txt").read_text(encoding="utf-8").splitlines()
        assert manifest["splits"][split]["lines"] == len(segmented) == len(english)
        assert spm.decode(segmented[0].split()) == english[0]
        assert (out / "bin" / f"{split}.bin").is_file()
    assert (out / "bin" / "dict.txt").is_file()


def test_own_text_with_held_out_splits(tmp_path):
    train = tmp_path / "mine.txt"
    train.write_text("".join(f"line number {i} of my own text .\n" for i in range(200)))
    out = tmp_path / "mine"
    prepare("--dataset", "custom-lm", "--train", str(train), "--subword", "none", "--valid-size", "10",
            "--test-size", "20", "--out", str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {split: manifest["splits"][split]["lines"] for split in ("train", "valid", "test")} == \
        {"train": 170, "valid": 10, "test": 20}
    assert sorted((out / "train.txt").read_text().splitlines() + (out / "valid.txt").read_text().splitlines()
                  + (out / "test.txt").read_text().splitlines()) == sorted(train.read_text().splitlines())


def test_force_replaces_an_earlier_lm_preparation_but_never_the_inputs(tmp_path, capsys):
    """The output contract of translation data holds for language models: --force
    replaces what an earlier prepare wrote, and refuses an --out that holds the inputs."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    train = corpus / "mine.txt"
    train.write_text("".join(f"line number {i} of my own text .\n" for i in range(200)))
    options = ("--dataset", "custom-lm", "--train", str(train), "--subword", "none")
    message = error_of(capsys, *options, "--out", str(corpus), "--force")
    assert "holds an input of this run" in message
    assert train.is_file() and sorted(p.name for p in corpus.iterdir()) == ["mine.txt"]

    out = tmp_path / "mine"
    prepare(*options, "--valid-size", "10", "--test-size", "10", "--out", str(out))
    prepare(*options, "--valid-size", "20", "--test-size", "10", "--out", str(out), "--force")
    assert json.loads((out / "manifest.json").read_text())["splits"]["valid"]["lines"] == 20


@pytest.mark.parametrize("case", ["empty", "binary", "blank_lines", "missing"])
def test_bad_own_text_is_one_line_and_no_output(tmp_path, capsys, case):
    bad = tmp_path / "bad.txt"
    if case == "empty":
        bad.write_bytes(b"")
    elif case == "binary":
        bad.write_bytes(bytes(range(256)) * 40)
    elif case == "blank_lines":
        bad.write_text("\n  \n\n")
    out = tmp_path / "out"
    message = error_of(capsys, "--dataset", "custom-lm", "--train", str(bad), "--subword", "none", "--out", str(out))
    expected = {"empty": "is empty", "binary": "binary file", "blank_lines": "has only empty lines (3)", "missing": "not found"}
    assert expected[case] in message and str(bad) in message
    no_partial_output(out)


@pytest.mark.parametrize("case", ["no_wiki_files", "not_an_archive", "binary_tokens"])
def test_wrong_wikitext_archive_is_one_line_and_no_output(tmp_path, capsys, case):
    archive = tmp_path / "wikitext-103-v1.zip"
    if case == "no_wiki_files":
        make_wikitext_archive(archive, layout="wikitext-2/wiki.{split}.raw")
    elif case == "not_an_archive":
        archive.write_bytes(b"<html>404 Not Found</html>\n")
    else:
        with zipfile.ZipFile(archive, "w") as bundle:
            for split in ("train", "valid", "test"):
                bundle.writestr(f"wikitext-103/wiki.{split}.tokens", b"\x00\x01\x02" * 100)
    out = tmp_path / "out"
    message = error_of(capsys, "--dataset", "wikitext-103", "--from-archive", str(archive), "--out", str(out))
    expected = {"no_wiki_files": "wiki.train.tokens not found", "not_an_archive": "corrupt or truncated",
                "binary_tokens": "binary file"}
    assert expected[case] in message
    no_partial_output(out)


def test_translation_options_are_refused_for_language_models(tmp_path, capsys):
    message = error_of(capsys, "--dataset", "sample-lm", "-s", "en", "--out", str(tmp_path / "x"))
    assert "--source-lang does not apply" in message
    message = error_of(capsys, "--dataset", "custom-lm", "--train", "a.txt", "b.txt", "--out", str(tmp_path / "x"))
    assert "one text file" in message


@pytest.mark.parametrize("splits", [("--train", "--valid"), ("--train", "--test"), ("--valid", "--test")])
def test_one_text_given_to_two_splits_is_refused(tmp_path, capsys, splits):
    """(Before: accepted; valid or test lines were training lines, and the perplexity measured memory.)"""
    text = tmp_path / "text.txt"
    text.write_text("".join(f"sentence number {index}\n" for index in range(200)))
    other = tmp_path / "other.txt"
    other.write_text("".join(f"other sentence {index}\n" for index in range(50)))
    given = {"--train": other, "--valid": other, "--test": other, splits[0]: text, splits[1]: text}
    out = tmp_path / "out"
    argv = ["--dataset", "custom-lm", "--subword", "none", "--out", str(out)]
    for flag in ("--train", "--valid", "--test"):
        argv += [flag, str(given[flag])]
    assert error_of(capsys, *argv) == f"error: {text} is given as {splits[0]} and as {splits[1]}: give each file once"
    no_partial_output(out)


def test_sample_lm_reads_one_archive_directory(tmp_path, capsys):
    message = error_of(capsys, "--dataset", "sample-lm", "--from-archive", str(tmp_path), str(tmp_path / "b"),
                       "--out", str(tmp_path / "x"))
    assert message == "error: sample-lm reads one --from-archive directory (the sample's), got 2"
