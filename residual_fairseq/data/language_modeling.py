"""Language-modeling corpora: one text per split, binarized with ``fairseq-preprocess --only-source``.

Three recipes, run by ``residual-fairseq-prepare --dataset NAME``:

- ``wikitext-103``: fairseq's ``examples/language_model/prepare-wikitext-103.sh`` -
  the word-level ``wikitext-103-v1.zip`` (downloaded, resumable, sha256-checked, or
  ``--from-archive FILE``), its ``wiki.{train,valid,test}.tokens`` binarized as they
  are (no subwords: the vocabulary is WikiText's own, ``<unk>`` included).
- ``sample-lm``: offline, the English side of the bundled ``data/sample-es-en`` with
  the translation sample's split, segmented with sentencepiece BPE.
- ``custom-lm``: your own text files, ``--train FILE [--valid FILE --test FILE]``
  (seeded held-out lines when valid/test are absent), sentencepiece BPE by default
  (``--subword none`` for text that is already segmented).

Output (like the translation pipeline's, written in a staging directory and moved
into place only when complete)::

    OUT/manifest.json   what, from where, how, counts, versions, checksums
    OUT/prepare.log
    OUT/{train,valid,test}.txt   the text that was binarized (one sentence/paragraph a line)
    OUT/spm.model                the subword model (when one was learned)
    OUT/bin/                     dict.txt, {split}.bin/.idx: fairseq-train --task language_modeling OUT/bin
"""
import datetime
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

from . import subword
from .binarize import run_fairseq_preprocess
from .datasets import (HeldOutSplits, Recipe, Source, check_distinct_files, describe_input, sample_corpus_dir,
                       split_files)
from .download import default_download_dir, find_file
from .errors import DataPreparationError
from .pipeline import input_fingerprints, library_versions
from .prepared import BINARY_DIR, MANIFEST_FORMAT, prepare_staged
from .text import map_lines
from .textio import UNDECODABLE, SkipCounter, read_lines, read_tsv_pairs, write_lines

logger = logging.getLogger("residual_fairseq.data")

SPLITS = ("train", "valid", "test")
TEXT_NAME = "{split}.txt"
# Options of the translation recipes that mean nothing for a single text.
TRANSLATION_ONLY = ("source_lang", "target_lang", "tokenizer", "lowercase", "min_len", "max_len",
                    "length_ratio", "reuse", "subword_model", "srcdict", "tgtdict")
BINARY_SNIFF_BYTES = 8192


def check_text_file(path, what="input file"):
    """A one-line error for a missing, empty or binary file (fairseq would binarize it silently)."""
    path = Path(path)
    if not path.is_file():
        raise DataPreparationError(f"{what} not found: {path}")
    if path.suffix != ".gz":
        with open(path, "rb") as handle:
            head = handle.read(BINARY_SNIFF_BYTES)
        if b"\x00" in head:
            raise DataPreparationError(f"{what} {path} is a binary file, not text")


def read_text(path, skips, what="input file"):
    """The lines of a UTF-8 text file; undecodable lines are counted and dropped.

    A file without a single non-empty decodable line is an error (empty, or not text).
    """
    check_text_file(path, what)
    lines = read_lines(path)
    undecodable = sum(line is UNDECODABLE for line in lines)
    kept = [line for line in lines if line is not UNDECODABLE]
    if not any(line.strip() for line in kept):
        reason = ("is empty" if not lines else "is not UTF-8 text" if undecodable
                  else f"has only empty lines ({len(lines)})")
        raise DataPreparationError(f"{what} {path} {reason}: no line to train a language model on")
    if undecodable * 2 > len(lines):
        raise DataPreparationError(f"{what} {path} is not UTF-8 text ({undecodable} of {len(lines)} lines undecodable)")
    skips.add("non_utf8", undecodable)
    return kept


class LanguageModelRecipe(Recipe):
    """A recipe whose build returns {split: lines} instead of bitexts."""

    defaults = {}

    def resolve(self, options):
        for name in TRANSLATION_ONLY:
            if getattr(options, name) not in (None, False):
                flag = "--" + name.replace("_", "-")
                raise DataPreparationError(f"{flag} does not apply to language-model dataset {self.name}")
        values = {key: value for key, value in self.defaults.items() if getattr(options, key) is None}
        options = replace(options, **values)
        if options.subword not in subword.METHODS:
            raise DataPreparationError(f"unknown subword method {options.subword!r}; choose one of "
                                       f"{', '.join(subword.METHODS)}")
        if options.subword != "none" and not (options.vocab_size or 0) > 0:
            raise DataPreparationError(f"--vocab-size must be a positive number, got {options.vocab_size}")
        return options

    def settings(self, options):
        """What decides the output (compared by a re-run)."""
        return {"dataset": self.name, "subword": options.subword,
                "vocab_size": options.vocab_size if options.subword != "none" else None,
                "valid_size": options.valid_size, "test_size": options.test_size, "seed": options.seed}


# --- WikiText-103 (fairseq examples/language_model/prepare-wikitext-103.sh) --------------

WIKITEXT103_SHA256 = "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"


class WikiText103(LanguageModelRecipe):
    name = "wikitext-103"
    summary = "WikiText-103 word level (prepare-wikitext-103.sh + fairseq-preprocess --only-source)"
    defaults = dict(subword="none")
    sources = (Source("wikitext-103-v1.zip", [
        "https://wikitext.smerity.com/wikitext-103-v1.zip",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",  # fairseq's script
    ], WIKITEXT103_SHA256),)

    def build(self, options, work_dir, skips, steps):
        roots, sources = self.fetch(options, work_dir)
        for record in sources:
            if "sha256" in record and record["sha256"] != WIKITEXT103_SHA256:
                logger.info("%s is not the published wikitext-103-v1.zip (sha256 differs); using it as given",
                            record["path"])
                record["official"] = False
        splits = {}
        for split in SPLITS:
            path = find_file(roots, f"wiki.{split}.tokens", f"WikiText-103 file wiki.{split}.tokens")
            splits[split] = read_text(path, skips, f"WikiText-103 file wiki.{split}.tokens")
        steps.append("wiki.{train,valid,test}.tokens of wikitext-103-v1.zip, as they are (word level)")
        return splits, sources


# --- the bundled sample and your own text --------------------------------------------

class SampleLm(LanguageModelRecipe):
    name = "sample-lm"
    summary = "English side of the bundled sample (data/sample-es-en), same split, offline"
    defaults = dict(subword="spm-bpe", vocab_size=4000)
    ENGLISH_COLUMN = 2  # reference<TAB>es<TAB>en

    def corpus_dir(self, options):
        return sample_corpus_dir(self.name, options)

    def input_files(self, options):
        directory = self.corpus_dir(options)
        return [directory / f"{split}.tsv.gz" for split in SPLITS]

    def build(self, options, work_dir, skips, steps):
        files = self.input_files(options)
        splits = {}
        for split, path in zip(SPLITS, files):
            _, english = read_tsv_pairs(path, skips, 0, self.ENGLISH_COLUMN)
            splits[split] = [line for line in english if line is not UNDECODABLE and line.strip()]
        steps.append("English column of data/sample-es-en/{train,valid,test}.tsv.gz (the translation sample's split)")
        return splits, [describe_input(path) for path in files]


class CustomLm(LanguageModelRecipe):
    name = "custom-lm"
    summary = "your own text: --train FILE [--valid FILE --test FILE], one sentence or paragraph a line"
    defaults = dict(subword="spm-bpe", vocab_size=8000)
    DEFAULT_HELD_OUT = 1000
    HELD_OUT_FRACTION = 20

    def resolve(self, options):
        options = super().resolve(options)
        for split in SPLITS:
            paths = getattr(options, split)
            if len(paths) > 1:
                raise DataPreparationError(f"--{split} takes one text file for a language model, got {len(paths)}")
        if not options.train:
            raise DataPreparationError("custom-lm needs --train FILE")
        check_distinct_files(split_files(options))
        return replace(options, **{split: [Path(p).resolve() for p in getattr(options, split)] for split in SPLITS})

    def input_files(self, options):
        return [path for split in SPLITS for path in getattr(options, split)]

    def build(self, options, work_dir, skips, steps):
        splits = {split: read_text(getattr(options, split)[0], skips, f"--{split} file")
                  for split in SPLITS if getattr(options, split)}
        steps.append("lines of the given files (undecodable lines dropped)")
        missing = [split for split in ("valid", "test") if split not in splits]
        if missing:
            train = splits["train"]
            limit = max(1, len(train) // self.HELD_OUT_FRACTION)
            sizes = {split: 0 for split in ("valid", "test")}
            for split in missing:
                given = getattr(options, f"{split}_size")
                sizes[split] = given if given is not None else min(self.DEFAULT_HELD_OUT, limit)
            held = HeldOutSplits.split(train, train, sizes["valid"], sizes["test"], options.seed, dropped=skips,
                                       unit="lines")
            splits["train"] = held["train"][0]
            for split in missing:
                splits[split] = held[split][0]
            steps.append(f"held out of train with seed {options.seed}: "
                         + ", ".join(f"{split} {sizes[split]} lines" for split in missing))
        return splits, [describe_input(path) for path in self.input_files(options)]


LM_RECIPES = {recipe.name: recipe for recipe in (WikiText103(), SampleLm(), CustomLm())}


# --- the pipeline ------------------------------------------------------------------------

def prepare_language_model(options):
    """Prepare ``options.dataset`` (one of :data:`LM_RECIPES`) into ``options.out``."""
    try:
        recipe = LM_RECIPES[options.dataset]
    except KeyError:
        raise DataPreparationError(f"unknown language-model dataset {options.dataset!r}; "
                                   f"choose one of {', '.join(LM_RECIPES)}") from None
    options = recipe.resolve(options)
    if options.download_dir is None:
        options = replace(options, download_dir=default_download_dir())
    settings = recipe.settings(options)
    settings["inputs"] = input_fingerprints(options, recipe.input_files(options))
    return prepare_staged(options, recipe.input_files(options), settings,
                          lambda staging: _run(recipe, options, settings, staging))


def _run(recipe, options, settings, staging):
    work_dir = staging / "work"
    work_dir.mkdir()
    skips, steps = SkipCounter(), []
    logger.info("preparing %s with %d worker(s)", options.dataset, options.workers)
    splits, sources = recipe.build(options, work_dir, skips, steps)
    if not any(line.strip() for line in splits["train"]):
        raise DataPreparationError("no training text left after reading the input")
    record = {"method": "none", "model": None}
    if options.subword != "none":
        training_file = work_dir / "subword-train.txt"
        write_lines(training_file, splits["train"])
        logger.info("learning %s subwords (%d)", options.subword, options.vocab_size)
        model_path, description = subword.learn(options.subword, options.vocab_size, training_file, staging,
                                                options.workers, progress=options.progress)
        encoder = subword.encoder_for(model_path)
        splits = {split: map_lines(encoder, lines, options.workers) for split, lines in splits.items()}
        steps += [description.replace("(both sides)", ""), f"all splits: {encoder.description}"]
        record = {"method": options.subword, "model": model_path.name, "vocab_size": options.vocab_size}
    for split, lines in splits.items():
        write_lines(staging / TEXT_NAME.format(split=split), lines)
    arguments = ["--only-source", "--destdir", str(staging / BINARY_DIR), "--workers", str(max(1, options.workers))]
    for split in SPLITS:
        arguments += [f"--{split}pref", str(staging / split) + ".txt"]
    logger.info("binarizing with fairseq-preprocess --only-source")
    run_fairseq_preprocess(arguments)
    steps.append("fairseq-preprocess " + " ".join(a.replace(str(staging) + os.sep, "") for a in arguments))
    shutil.rmtree(work_dir)
    for reason, count in skips.as_dict().items():
        logger.info("skipped %d line(s): %s", count, reason)
    return {
        "format": MANIFEST_FORMAT,
        "task": "language_modeling",
        "dataset": options.dataset,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        "sources": sources,
        "steps": steps,
        "subword": record,
        "splits": {split: {"lines": len(lines), "tokens": sum(len(line.split()) for line in lines)}
                   for split, lines in splits.items()},
        "skipped": skips.as_dict(),
        "binarized": BINARY_DIR,
        "versions": library_versions(),
    }
