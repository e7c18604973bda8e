"""IWSLT'14, WMT'14 and OPUS-100 pipelines end to end on miniature archives in the real formats."""
import json
from pathlib import Path

import pytest

from residual_fairseq.data import PrepareOptions, prepare
from helpers.data_builders import (
    IWSLT_TEST_SETS, WMT_LONG_LINE, build_iwslt_archive, build_opus_archives, build_wmt_archives, numbered_pair,
)


def lines_of(path):
    return Path(path).read_text("utf-8").splitlines()


def tokenized_lower(text):
    """What Moses tokenization + lowercasing makes of a numbered_pair sentence ('... licht.')."""
    return text[:-1].lower() + " ."


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory):
    root = tmp_path_factory.mktemp("iwslt")
    archive = build_iwslt_archive(root / "de-en.tgz")
    options = PrepareOptions(dataset="iwslt14-de-en", out=root / "out", from_archive=[archive], vocab_size=40,
                             progress=False)
    return prepare(options)


def test_iwslt_train_drops_header_lines_and_strips_title_tags(iwslt):
    train_de = lines_of(iwslt.out_dir / "tok" / "train.de")
    assert train_de[:2] == ["ein titel", "eine beschreibung"]
    assert not any("url" in line or "talkid" in line or "keywords" in line for line in train_de)


def test_iwslt_tokenizes_lowercases_and_cleans_like_clean_corpus_n(iwslt):
    train_de = lines_of(iwslt.out_dir / "tok" / "train.de")
    train_en = lines_of(iwslt.out_dir / "tok" / "train.en")
    assert train_de[2] == tokenized_lower(numbered_pair(1)[0])  # 'satz 1 : ... licht .'
    assert train_en[2] == tokenized_lower(numbered_pair(1)[1])
    assert not any(line.startswith("wort") or line == "ein zwei drei vier" for line in train_de)
    assert iwslt.manifest["skipped"] == {"clean_length": 1, "clean_ratio": 1}


def test_iwslt_valid_is_every_23rd_cleaned_line(iwslt):
    # Cleaned lines: title, description, pairs 1..60 -> lines 23 and 46 are pairs 21 and 44.
    valid_en = lines_of(iwslt.out_dir / "tok" / "valid.en")
    assert valid_en == [tokenized_lower(numbered_pair(21)[1]), tokenized_lower(numbered_pair(44)[1])]
    train_en = lines_of(iwslt.out_dir / "tok" / "train.en")
    assert len(train_en) == 60 and not set(valid_en) & set(train_en)


def test_iwslt_test_is_the_five_xml_sets_in_order(iwslt):
    test_de = lines_of(iwslt.out_dir / "tok" / "test.de")
    assert len(test_de) == 2 * len(IWSLT_TEST_SETS)
    assert test_de[1] == "guten morgen ."
    assert test_de[0].startswith("das ist &apos; s ,") and "’" not in test_de[0]  # ’ became ' before Moses
    assert "dev2010" in test_de[0] and "tst2012" in test_de[-2]
    assert iwslt.manifest["splits"]["test"]["parts"] == list(IWSLT_TEST_SETS)


def test_iwslt_bpe_text_and_binarized_joined_dictionary(iwslt):
    assert (iwslt.out_dir / "bpe.codes").is_file()
    assert any("@@" in line for line in lines_of(iwslt.out_dir / "train.de"))
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert (iwslt.bin_dir / f"{split}.de-en.{lang}.bin").is_file()
    assert (iwslt.bin_dir / "dict.de.txt").read_text() == (iwslt.bin_dir / "dict.en.txt").read_text()
    manifest = json.loads((iwslt.out_dir / "manifest.json").read_text())
    assert manifest["subword"] == {"method": "bpe", "model": "bpe.codes", "vocab_size": 40}
    assert any(step.startswith("fairseq-preprocess") and "--joined-dictionary" in step for step in manifest["steps"])
    assert manifest["versions"]["sacremoses"] and manifest["sources"][0]["sha256"]


def test_iwslt_reverse_direction_and_separate_dictionaries(tmp_path):
    archive = build_iwslt_archive(tmp_path / "de-en.tgz")
    prepared = prepare(PrepareOptions(dataset="iwslt14-de-en", out=tmp_path / "out", source_lang="en",
                                      target_lang="de", from_archive=[archive], subword="none",
                                      joined_dictionary=False, progress=False))
    assert (prepared.bin_dir / "train.en-de.en.bin").is_file()
    assert (prepared.bin_dir / "dict.de.txt").read_text() != (prepared.bin_dir / "dict.en.txt").read_text()


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    root = tmp_path_factory.mktemp("wmt")
    archives = build_wmt_archives(root / "downloads")
    return prepare(PrepareOptions(dataset="wmt14-en-de", out=root / "out", from_archive=[archives],
                                  subword="none", progress=False))


def test_wmt_normalizes_punctuation_removes_non_printing_and_splits_hyphens(wmt):
    train_de = lines_of(wmt.out_dir / "tok" / "train.de")
    train_en = lines_of(wmt.out_dir / "tok" / "train.en")
    assert train_de[4] == "Er sagte &quot; ja &quot; zum State @-@ of @-@ the @-@ Art Modell ."
    assert train_en[4] == "He said &quot; yes &quot; to the state @-@ of @-@ the @-@ art model ."


def test_wmt_valid_is_every_100th_line_and_cleaning_follows_subwords(wmt):
    # Concatenation: europarl 1-100, commoncrawl 1-100, news-commentary 1-60.
    sentence_100 = numbered_pair(100)[1][:-1] + " ."
    assert lines_of(wmt.out_dir / "valid.en") == [f"europarl {sentence_100}", f"commoncrawl {sentence_100}"]
    train_en = lines_of(wmt.out_dir / "train.en")
    assert len(train_en) == 258 - 2  # minus the 260-token pair and the pair with an empty side
    assert not any(line.startswith("long") for line in train_en)
    assert lines_of(wmt.out_dir / "tok" / "train.en")[WMT_LONG_LINE - 1].startswith("long")  # kept until then
    assert wmt.manifest["skipped"] == {"clean_length": 2}


def test_wmt_test_is_newstest2014_sgml(wmt):
    assert lines_of(wmt.out_dir / "test.en") == ["It &apos;s a well @-@ known fact .", "Second line ."]
    assert lines_of(wmt.out_dir / "test.de") == ["Es ist eine bekannte Tatsache .", "Zweite Zeile ."]
    assert (wmt.bin_dir / "test.en-de.de.idx").is_file()


def test_opus_two_pairs_both_directions_with_target_tags(tmp_path):
    archives = build_opus_archives(tmp_path / "opus")
    prepared = prepare(PrepareOptions(dataset="opus-100", out=tmp_path / "out", pairs=["de", "en-fr"],
                                      from_archive=[archives], vocab_size=80, progress=False))
    train_src = lines_of(prepared.out_dir / "train.src")
    assert len(train_src) == 4 * 40
    assert {line.split()[0] for line in train_src} == {"<2de>", "<2fr>", "<2en>"}
    assert not any(line.startswith("<2") for line in lines_of(prepared.out_dir / "train.tgt"))
    tests = prepared.manifest["splits"]
    assert [tests[name]["parts"] for name in ("test", "test1", "test2", "test3")] == [
        ["en-de"], ["de-en"], ["en-fr"], ["fr-en"]]
    assert tests["valid"]["pairs"] == 4 * 4
    for name in ("test", "test1", "test2", "test3"):
        assert (prepared.bin_dir / f"{name}.src-tgt.src.bin").is_file()
    dictionary = (prepared.bin_dir / "dict.src.txt").read_text()
    assert "<2de> " in dictionary and "<2en> " in dictionary
    assert (prepared.out_dir / "spm.model").is_file()
    assert lines_of(prepared.out_dir / "test1.src")[0].startswith("<2en> ")
