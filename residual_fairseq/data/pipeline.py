"""The shared translation preparation pipeline: a recipe, then subwords, cleaning and fairseq-preprocess.

``prepare(options)`` runs a dataset recipe, then the shared tail: subword
segmentation (learned or reused), late cleaning, language tags, text files and
``fairseq-preprocess``. How the output directory is written (staged, then moved into
place, with ``manifest.json`` recording what was done; a re-run with the same settings
does nothing) is :mod:`.prepared`'s.

Output layout::

    OUT/manifest.json      what, from where, how, counts, skips, versions, checksums
    OUT/prepare.log        the log of the run
    OUT/tok/{split}.{lang} text before subwords (tokenized/cleaned as the recipe does)
    OUT/{split}.{lang}     final text: subwords (and tags), what was binarized
    OUT/bpe.codes | OUT/spm.model   the subword model
    OUT/bin/               fairseq-preprocess output: pass it to fairseq-train
"""
import datetime
import logging
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

from ..argtypes import is_digits
from . import subword
from .binarize import preprocess_arguments, run_fairseq_preprocess
from .corpus import CorpusBuild
from .datasets import recipe_for
from .download import default_download_dir, sha256_of
from .errors import DataPreparationError
from .prepared import BINARY_DIR, MANIFEST_FORMAT, MANIFEST_NAME, is_prepare_manifest, prepare_staged, read_manifest
from .text import clean_corpus, map_lines
from .textio import write_lines

logger = logging.getLogger("residual_fairseq.data")

TOKENIZED_DIR = "tok"


def prepare(options):
    """Prepare ``options.dataset`` into ``options.out``; returns :class:`PreparedData`."""
    recipe = recipe_for(options.dataset)
    options = recipe.resolve(options)
    if options.subword not in subword.METHODS:
        raise DataPreparationError(f"unknown subword method {options.subword!r}; choose one of {', '.join(subword.METHODS)}")
    check_numbers(options)
    options = apply_reuse(options)
    if options.download_dir is None:
        options = _replace(options, download_dir=default_download_dir())
    settings = options.settings()
    settings["inputs"] = input_fingerprints(options, recipe.input_files(options))
    return prepare_staged(options, recipe.input_files(options), settings,
                          lambda staging: run_pipeline(recipe, options, settings, staging))


def _replace(options, **changes):
    from dataclasses import replace

    return replace(options, **changes)


# --- values that cannot be meant ---------------------------------------------------------

def check_numbers(options):
    """Refuse settings that would silently leave nothing (or nonsense) to train on."""
    def fail(message):
        raise DataPreparationError(message)

    if options.min_len is not None and options.min_len < 0:
        fail(f"--min-len must be 0 or more, got {options.min_len}")
    if options.max_len is not None and options.max_len < 1:
        fail(f"--max-len must be at least 1, got {options.max_len}")
    if None not in (options.min_len, options.max_len) and options.min_len > options.max_len:
        fail(f"--min-len {options.min_len} is above --max-len {options.max_len}: no pair could pass")
    ratio = options.length_ratio
    if ratio is not None and (ratio != ratio or ratio in (float("inf"), float("-inf")) or ratio < 0):
        fail(f"--length-ratio must be a finite number >= 1 (or 0: off), got {ratio}")
    if ratio is not None and 0 < ratio < 1:
        fail(f"--length-ratio {ratio} is below 1: the longer side over the shorter is never below 1 "
             "(0 turns the filter off)")
    if options.vocab_size is not None and options.vocab_size < 1 and options.subword != "none":
        fail(f"--vocab-size must be at least 1, got {options.vocab_size}")
    for name in ("valid_size", "test_size"):
        value = getattr(options, name)
        if value is not None and value < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if options.workers < 1:
        fail(f"--workers must be at least 1, got {options.workers}")
    columns = tuple(options.tsv_columns)
    if len(columns) != 2 or min(columns) < 0 or columns[0] == columns[1]:
        fail(f"--tsv-columns wants two different column numbers >= 0, like 0,1, not {','.join(map(str, columns))}")


# --- reuse of a trained model's subwords and dictionaries --------------------------------

def apply_reuse(options):
    """Fill --subword-model/--srcdict/--tgtdict from a previous output directory (``--reuse``)."""
    if not options.reuse:
        return _check_reused_files(options)
    previous = Path(options.reuse)
    manifest = read_manifest(previous)
    if manifest is None:
        raise DataPreparationError(f"--reuse {previous}: no {MANIFEST_NAME} there (not a prepared directory)")
    if not is_prepare_manifest(manifest):
        raise DataPreparationError(f"--reuse {previous}: its {MANIFEST_NAME} is not one residual-fairseq-prepare "
                                   "wrote (format/source_lang/target_lang/subword/files missing or malformed)")
    if manifest.get("task") == "language_modeling":
        raise DataPreparationError(f"--reuse {previous}: a language-model preparation (one language, no pair)")
    model = manifest.get("subword", {}).get("model")
    langs = manifest["source_lang"], manifest["target_lang"]
    changes = dict(
        subword_model=options.subword_model or (previous / model if model else None),
        srcdict=options.srcdict or previous / BINARY_DIR / f"dict.{langs[0]}.txt",
        tgtdict=options.tgtdict or previous / BINARY_DIR / f"dict.{langs[1]}.txt",
    )
    if not model:
        changes["subword"] = "none"
    return _check_reused_files(_replace(options, **changes))


def _check_reused_files(options):
    for path, what in ((options.subword_model, "subword model"), (options.srcdict, "--srcdict"),
                       (options.tgtdict, "--tgtdict")):
        if path is not None and not Path(path).is_file():
            raise DataPreparationError(f"{what} not found: {path}")
    for path, flag in ((options.srcdict, "--srcdict"), (options.tgtdict, "--tgtdict")):
        if path is not None:
            check_dictionary_file(path, flag)
    if options.subword_model is not None:
        method = subword.method_of_model_file(options.subword_model)
        subword.check_model_file(options.subword_model)
        options = _replace(options, subword="bpe" if method == "bpe" else "spm", vocab_size=None)
    return options


def check_dictionary_file(path, flag):
    """A fairseq dictionary: one ``<token> <count>`` per line (optionally ``#fairseq:overwrite``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            entries = 0
            for number, line in enumerate(handle, start=1):
                fields = line.rstrip("\n").rsplit(" ", 2)
                if fields and fields[-1] == "#fairseq:overwrite":
                    fields = fields[:-1]
                count = fields[1].lstrip("-") if len(fields) == 2 else ""
                if not fields[0] or not is_digits(count):
                    raise DataPreparationError(f"{flag} {path} is not a fairseq dictionary: line {number} is not "
                                               "'<token> <count>' (use the dict.<lang>.txt of a fairseq data directory)")
                entries += 1
    except UnicodeDecodeError:
        raise DataPreparationError(f"{flag} {path} is not a fairseq dictionary (not UTF-8 text)") from None
    if entries == 0:
        raise DataPreparationError(f"{flag} {path} is empty: not a fairseq dictionary")
    # What the line format cannot show (a duplicate symbol, one of fairseq's own specials), fairseq's
    # parser refuses: read it with that parser now, not in the middle of fairseq-preprocess.
    from ..errors import UserError
    from .binarized import dictionary_size

    try:
        dictionary_size(path)
    except UserError as err:
        raise DataPreparationError(f"{flag} {err}") from None


def input_fingerprints(options, corpus_files):
    """sha256 of local inputs (corpus files, reused model/dictionaries): a changed file makes a re-run real work."""
    paths = list(corpus_files) + [options.subword_model, options.srcdict, options.tgtdict]
    return {str(path): sha256_of(path) for path in paths if path is not None and Path(path).is_file()}


# --- the shared tail --------------------------------------------------------------------

def run_pipeline(recipe, options, settings, staging):
    work_dir = staging / "work"
    work_dir.mkdir()
    build = CorpusBuild(options.source_lang, options.target_lang)
    logger.info("preparing %s (%s -> %s) with %d worker(s)", options.dataset, options.source_lang,
                options.target_lang, options.workers)
    recipe.build(options, work_dir, build)
    splits = group_splits(build.parts)
    if not splits.get("train") or not splits["train"][0]:
        raise DataPreparationError(f"no training pairs left after reading and cleaning the input "
                                   f"({build.skips.describe()})")
    for split, (sources, _) in splits.items():
        if not sources:
            raise DataPreparationError(f"no {split} pairs left after reading and cleaning the input "
                                       f"({build.skips.describe()})")
    src, tgt = build.source_lang, build.target_lang
    for split, (sources, targets) in splits.items():
        write_lines(staging / TOKENIZED_DIR / f"{split}.{src}", sources)
        write_lines(staging / TOKENIZED_DIR / f"{split}.{tgt}", targets)

    encoder, subword_record = subword_encoder(options, build, staging, work_dir)
    cleaning = recipe.cleaning(options)
    for part in build.parts:
        if encoder is not None:
            part.source = map_lines(encoder, part.source, options.workers)
            part.target = map_lines(encoder, part.target, options.workers)
        if cleaning.stage == "after" and part.split in cleaning.splits:
            part.source, part.target = clean_corpus(part.source, part.target, build.skips, cleaning.min_len,
                                                    cleaning.max_len, cleaning.ratio)
        if part.source_tag:
            part.source = [f"{part.source_tag} {line}" for line in part.source]
    if encoder is not None:
        build.steps.append(f"all splits: {encoder.description}")
    if cleaning.stage == "after":
        build.steps.append(cleaning.describe())

    splits = group_splits(build.parts)
    for split, (sources, _) in splits.items():
        if not sources:
            raise DataPreparationError(
                f"no {split} pairs left after cleaning (min/max length {options.min_len}/{options.max_len}, "
                f"length ratio {options.length_ratio or 'off'}; {build.skips.describe()}): loosen the limits")
    for split, (sources, targets) in splits.items():
        write_lines(staging / f"{split}.{src}", sources)
        write_lines(staging / f"{split}.{tgt}", targets)
    arguments = preprocess_arguments(src, tgt, staging, staging / BINARY_DIR, {name: name for name in splits},
                                     options.joined_dictionary, options.srcdict, options.tgtdict, options.workers)
    logger.info("binarizing with fairseq-preprocess")
    run_fairseq_preprocess(arguments)
    build.steps.append("fairseq-preprocess " + " ".join(_relative_arguments(arguments, staging)))
    shutil.rmtree(work_dir)
    skipped = build.skips.as_dict()
    for reason, count in skipped.items():
        logger.info("skipped %d pair(s): %s", count, reason)
    return {
        "format": MANIFEST_FORMAT,
        "dataset": options.dataset,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_lang": src,
        "target_lang": tgt,
        "settings": settings,
        "sources": build.sources,
        "steps": build.steps,
        "subword": subword_record,
        "splits": {split: {"pairs": len(sources), "parts": labels_of(build.parts, split)}
                   for split, (sources, _) in splits.items()},
        "skipped": skipped,
        "binarized": BINARY_DIR,
        "versions": library_versions(),
    }


def group_splits(parts):
    """Concatenate parts per split, in first-seen order."""
    splits = {}
    for part in parts:
        sources, targets = splits.setdefault(part.split, ([], []))
        sources += part.source
        targets += part.target
    return splits


def labels_of(parts, split):
    return [part.label for part in parts if part.split == split]


def subword_encoder(options, build, staging, work_dir):
    """The line encoder to apply (None for --subword none) and its manifest record."""
    if options.subword_model is not None:
        model_name = subword.BPE_CODES_NAME if options.subword == "bpe" else f"{subword.SPM_MODEL_PREFIX}.model"
        shutil.copyfile(options.subword_model, staging / model_name)
        build.steps.append(f"subword model reused from {options.subword_model}")
        return subword.encoder_for(staging / model_name), {
            "method": options.subword, "model": model_name, "reused_from": str(options.subword_model)}
    if options.subword == "none":
        return None, {"method": "none", "model": None}
    training_file = work_dir / "subword-train.txt"
    with open(training_file, "w", encoding="utf-8") as handle:
        for part in build.parts:
            if part.split == "train":
                for line in part.source + part.target:
                    handle.write(line + "\n")
    logger.info("learning %s subwords (%d)", options.subword, options.vocab_size)
    model_path, description = subword.learn(options.subword, options.vocab_size, training_file, staging,
                                            options.workers, progress=options.progress)
    build.steps.append(description)
    return subword.encoder_for(model_path), {
        "method": options.subword, "model": model_path.name, "vocab_size": options.vocab_size}


def _relative_arguments(arguments, staging):
    return [argument.replace(str(staging) + os.sep, "") for argument in arguments]


def library_versions():
    versions = {"python": platform.python_version()}
    for distribution in ("residual-fairseq", "ve-fairseq", "fairseq-fixed", "fairseq", "torch", "sacremoses",
                         "subword-nmt", "sentencepiece", "numpy"):
        try:
            versions[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return versions
