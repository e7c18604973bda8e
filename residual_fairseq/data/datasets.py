"""Dataset recipes: where each corpus comes from and the steps that turn it into bitexts.

A recipe knows its sources, default settings and language pairs, and builds a
:class:`~residual_fairseq.data.corpus.CorpusBuild` of tokenized (and, where the
original script cleans early, cleaned) bitexts. Subword segmentation, late
cleaning, tags and binarization are shared: see :mod:`.pipeline`.
"""
import random
import re
from dataclasses import replace
from pathlib import Path

from ..argtypes import same_file
from .corpus import Bitext, Cleaning, CorpusBuild
from .download import download, find_file, sha256_of, unpack_sources
from ..resources import shipped_dir
from .errors import DataPreparationError
from .text import (
    Lowercase, MosesTokenize, NormalizePunctuation, Pipeline, RemoveNonPrinting, ReplaceCurlyApostrophe,
    clean_corpus, every_nth_split, extract_segments, map_lines, strip_iwslt_train_markup,
)
from .textio import pair_up, read_lines, read_tsv_pairs

LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[_-][A-Za-z0-9]+)?\Z")  # \Z, not $: "$" also matches before a final newline


class Source:
    """One file to fetch: tried URLs in order, its local name, and a sha256 where known."""

    def __init__(self, name, urls, sha256=None):
        self.name, self.urls, self.sha256 = name, list(urls), sha256


class Recipe:
    name = ""
    summary = ""
    languages = ()            # the two languages of a fixed pair; empty: any (validated)
    defaults = {}
    sources = ()

    def resolve(self, options):
        """Options with every dataset default filled in and validated."""
        source, target = options.source_lang or self.languages[0], options.target_lang or self.languages[1]
        if {source, target} != set(self.languages):
            raise DataPreparationError(
                f"unknown language pair {source}-{target} for {self.name}: it has "
                f"{self.languages[0]}-{self.languages[1]} (either direction)"
            )
        return fill_defaults(replace(options, source_lang=source, target_lang=target), self.defaults)

    def cleaning(self, options):
        stage, splits = self.defaults["clean_stage"], self.defaults.get("clean_splits", ("train",))
        ratio = options.length_ratio or None
        return Cleaning(stage, options.min_len, options.max_len, ratio, splits)

    def fetch(self, options, work_dir):
        """Directories holding the unpacked sources, plus their manifest records."""
        if options.from_archive:
            paths = list(options.from_archive)
        else:
            paths = [download(source.urls, Path(options.download_dir) / source.name, source.sha256, options.progress)
                     for source in self.sources_for(options)]
        records = [describe_input(path) for path in paths]
        return unpack_sources(paths, Path(work_dir) / "unpacked"), records

    def sources_for(self, options):
        return list(self.sources)

    def input_files(self, options):
        """Local files whose content decides the output (fingerprinted for the no-op check)."""
        return []


def fill_defaults(options, defaults):
    values = {key: value for key, value in defaults.items()
              if hasattr(options, key) and getattr(options, key) is None}
    options = replace(options, **values)
    if options.tokenizer not in ("moses", "none"):
        raise DataPreparationError(f"unknown tokenizer {options.tokenizer!r}; choose moses or none")
    return options


def describe_input(path):
    path = Path(path)
    if path.is_file():
        return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256_of(path)}
    if path.is_dir():
        files = sorted(item for item in path.rglob("*") if item.is_file())
        return {"path": str(path.resolve()), "files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    raise DataPreparationError(f"archive or directory not found: {path}")


def text_steps(options, lang, aggressive=False):
    """The per-language tokenization pipeline selected by ``--tokenizer``/``--lowercase``."""
    steps = []
    if options.tokenizer == "moses":
        steps.append(MosesTokenize(lang, aggressive_dash_splits=aggressive))
    if options.lowercase:
        steps.append(Lowercase())
    return Pipeline(steps)


def process_pair(options, build, source_lines, target_lines, label, aggressive=False, drop_empty=True, names=None):
    """Tokenize both sides (per ``options``) and pair them up; returns (sources, targets).

    ``names``: what the two sides are called in messages (default ``LABEL.SRC``, ``LABEL.TGT``).
    """
    source_steps = text_steps(options, build.source_lang, aggressive)
    target_steps = text_steps(options, build.target_lang, aggressive)
    sources = map_lines(source_steps, source_lines, options.workers)
    targets = map_lines(target_steps, target_lines, options.workers)
    names = names or (f"{label}.{build.source_lang}", f"{label}.{build.target_lang}")
    return pair_up(sources, targets, build.skips, *names, drop_empty=drop_empty)


def test_segments(path):
    """The <seg> lines of an XML/SGML test set with ’ made ' (both fairseq scripts do this)."""
    straighten = ReplaceCurlyApostrophe()
    return [straighten(segment) if segment is not None else None for segment in extract_segments(read_lines(path))]


# --- IWSLT'14 German-English (fairseq examples/translation/prepare-iwslt14.sh) -----------

class Iwslt14(Recipe):
    name = "iwslt14-de-en"
    summary = "IWSLT'14 German-English TED talks (prepare-iwslt14.sh steps)"
    languages = ("de", "en")
    defaults = dict(tokenizer="moses", lowercase=True, subword="bpe", vocab_size=10000,
                    min_len=1, max_len=175, length_ratio=1.5, clean_stage="before")
    sources = (Source("iwslt14-de-en.tgz", [
        "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
        "https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz",
    ]),)
    VALID_EVERY = 23
    TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                 "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")

    def build(self, options, work_dir, build):
        roots, build.sources = self.fetch(options, work_dir)
        src, tgt = build.source_lang, build.target_lang
        train = {lang: strip_iwslt_train_markup(read_lines(find_file(roots, f"train.tags.de-en.{lang}")))
                 for lang in (src, tgt)}
        build.steps.append("train.tags: drop <url>/<talkid>/<keywords> lines, strip <title>/<description> tags")
        tokenize_only = replace(options, lowercase=False)  # the script lowercases after cleaning
        sources, targets = process_pair(tokenize_only, build, train[src], train[tgt], "train.tags.de-en")
        build.steps.append(f"train: {text_steps(tokenize_only, src).description}")
        cleaning = self.cleaning(options)
        sources, targets = clean_corpus(sources, targets, build.skips, cleaning.min_len, cleaning.max_len,
                                        cleaning.ratio)
        build.steps.append(cleaning.describe())
        if options.lowercase:
            sources, targets = [line.lower() for line in sources], [line.lower() for line in targets]
            build.steps.append("train: lowercase")
        train_sources, valid_sources = every_nth_split(sources, self.VALID_EVERY)
        train_targets, valid_targets = every_nth_split(targets, self.VALID_EVERY)
        build.steps.append(f"valid = every {self.VALID_EVERY}th line of cleaned train (removed from train)")
        build.parts += [Bitext("train", train_sources, train_targets, f"{src}-{tgt}"),
                        Bitext("valid", valid_sources, valid_targets, f"{src}-{tgt}")]
        for test_set in self.TEST_SETS:
            sides = []
            for lang in (src, tgt):
                sides.append(test_segments(find_file(roots, f"{test_set}.de-en.{lang}.xml")))
            sources, targets = process_pair(options, build, sides[0], sides[1], test_set)
            build.parts.append(Bitext("test", sources, targets, test_set))
        build.steps.append("test = " + " + ".join(self.TEST_SETS) + ": <seg> text, ’ -> ', "
                           + text_steps(options, src).description)


# --- WMT'14 English-German (prepare-wmt14en2de.sh --icml17) --------------------------------

class Wmt14(Recipe):
    name = "wmt14-en-de"
    summary = "WMT'14 English-German: europarl v7, commoncrawl, news-commentary v9; newstest2014"
    languages = ("en", "de")
    defaults = dict(tokenizer="moses", lowercase=False, subword="bpe", vocab_size=40000,
                    min_len=1, max_len=250, length_ratio=1.5, clean_stage="after",
                    clean_splits=("train", "valid"))
    sources = (
        Source("training-parallel-europarl-v7.tgz", ["http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"]),
        Source("training-parallel-commoncrawl.tgz", ["http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"]),
        Source("training-parallel-nc-v9.tgz", ["http://statmt.org/wmt14/training-parallel-nc-v9.tgz"]),
        Source("test-full.tgz", ["http://statmt.org/wmt14/test-full.tgz"]),
    )
    CORPORA = ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en")
    VALID_EVERY = 100

    def train_steps(self, options, lang):
        steps = [NormalizePunctuation(lang), RemoveNonPrinting()]
        return Pipeline(steps + text_steps(options, lang, aggressive=True).steps)

    def build(self, options, work_dir, build):
        roots, build.sources = self.fetch(options, work_dir)
        src, tgt = build.source_lang, build.target_lang
        sources, targets = [], []
        for corpus in self.CORPORA:
            sides = [map_lines(self.train_steps(options, lang), read_lines(find_file(roots, f"{corpus}.{lang}")),
                               options.workers) for lang in (src, tgt)]
            # Empty pairs stay until clean-corpus-n, so every 100th line is the script's.
            corpus_sources, corpus_targets = pair_up(sides[0], sides[1], build.skips, f"{corpus}.{src}",
                                                     f"{corpus}.{tgt}", drop_empty=False)
            sources += corpus_sources
            targets += corpus_targets
        build.steps.append("train = " + " + ".join(self.CORPORA) + ": " + self.train_steps(options, src).description)
        train_sources, valid_sources = every_nth_split(sources, self.VALID_EVERY)
        train_targets, valid_targets = every_nth_split(targets, self.VALID_EVERY)
        build.steps.append(f"valid = every {self.VALID_EVERY}th line of train (removed from train)")
        build.parts += [Bitext("train", train_sources, train_targets, f"{src}-{tgt}"),
                        Bitext("valid", valid_sources, valid_targets, f"{src}-{tgt}")]
        sides = []
        for lang in (src, tgt):
            role = "src" if lang == src else "ref"
            sides.append(test_segments(find_file(roots, f"newstest2014-deen-{role}.{lang}.sgm")))
        test_sources, test_targets = process_pair(options, build, sides[0], sides[1], "newstest2014",
                                                  aggressive=True)
        build.parts.append(Bitext("test", test_sources, test_targets, "newstest2014"))
        build.steps.append("test = newstest2014 <seg> text, ’ -> ', "
                           + text_steps(options, src, aggressive=True).description)


# --- OPUS-100 (English-centric, multilingual with target-language tags) ----------------------

OPUS100_LANGUAGES = frozenset(
    "af am an ar as az be bg bn br bs ca cs cy da de dz el eo es et eu fa fi fr fy ga gd gl gu ha he hi hr "
    "hu hy id ig is it ja ka kk km kn ko ku ky li lt lv mg mk ml mn mr ms mt my nb ne nl nn no oc or pa pl "
    "ps pt ro ru rw se sh si sk sl sq sr sv ta te tg th tk tr tt ug uk ur uz vi wa xh yi yo zh zu".split()
)
OPUS100_ARCHIVE_URL = "https://object.pouta.csc.fi/OPUS-100/v1.0/opus-100-corpus-{pair}-v1.0.tar.gz"
OPUS100_MIRROR_URL = "http://data.statmt.org/opus-100-corpus/v1.0/supervised/{pair}/opus.{pair}-{split}.{lang}"


def opus_pair_name(lang):
    """OPUS-100 names each pair with its two codes in alphabetical order: de-en, en-fr."""
    return "-".join(sorted(("en", lang)))


class Opus100(Recipe):
    name = "opus-100"
    summary = "OPUS-100 English-centric pairs; joint sentencepiece; <2xx> target tags on the source"
    defaults = dict(tokenizer="none", lowercase=False, subword="spm-bpe", vocab_size=64000,
                    min_len=1, max_len=250, length_ratio=0, clean_stage="after")
    TAG = "<2{lang}>"

    def resolve(self, options):
        languages = []
        for pair in options.pairs:
            lang = pair.strip().lower()
            if "-" in lang:
                codes = set(lang.split("-"))
                if "en" not in codes or len(codes) != 2:
                    raise DataPreparationError(f"OPUS-100 pairs are English-centric: {pair!r} has no English side")
                (lang,) = codes - {"en"}
            if lang not in OPUS100_LANGUAGES:
                raise DataPreparationError(f"unknown language code {lang!r}: OPUS-100 has {' '.join(sorted(OPUS100_LANGUAGES))}")
            if lang in languages:
                raise DataPreparationError(f"--pairs names {lang} twice ({','.join(options.pairs)}): "
                                           "give each pair once")
            languages.append(lang)
        if not languages:
            raise DataPreparationError("opus-100 needs --pairs, e.g. --pairs de,fr (each paired with English)")
        if options.directions not in ("both", "from-en", "to-en"):
            raise DataPreparationError(f"unknown --directions {options.directions!r}; choose both, from-en or to-en")
        if options.source_lang or options.target_lang:
            raise DataPreparationError("opus-100 sets its languages with --pairs and --directions, not --source-lang")
        options = replace(options, pairs=languages, source_lang="src", target_lang="tgt")
        return fill_defaults(options, self.defaults)

    def directions_of(self, options):
        for lang in options.pairs:
            if options.directions in ("both", "from-en"):
                yield "en", lang
            if options.directions in ("both", "to-en"):
                yield lang, "en"

    def fetch(self, options, work_dir):
        if options.from_archive:
            return super().fetch(options, work_dir)
        paths = [self.download_pair(options, lang) for lang in options.pairs]
        return unpack_sources(paths, Path(work_dir) / "unpacked"), [describe_input(path) for path in paths]

    def download_pair(self, options, lang):
        """The per-pair archive; if that host fails, the six plain files from the statmt mirror."""
        pair = opus_pair_name(lang)
        archive_url = OPUS100_ARCHIVE_URL.format(pair=pair)
        try:
            return download([archive_url], Path(options.download_dir) / f"opus-100-corpus-{pair}-v1.0.tar.gz",
                            progress=options.progress)
        except DataPreparationError as archive_failure:
            pair_dir = Path(options.download_dir) / "opus-100-corpus" / "v1.0" / "supervised" / pair
            try:
                for split in ("train", "dev", "test"):
                    for code in pair.split("-"):
                        url = OPUS100_MIRROR_URL.format(pair=pair, split=split, lang=code)
                        download([url], pair_dir / f"opus.{pair}-{split}.{code}", progress=options.progress)
            except DataPreparationError as mirror_failure:
                raise DataPreparationError(f"{archive_failure}; mirror: {mirror_failure}") from None
            return pair_dir

    def build(self, options, work_dir, build):
        roots, build.sources = self.fetch(options, work_dir)
        test_index = 0
        for source_lang, target_lang in self.directions_of(options):
            lang = target_lang if source_lang == "en" else source_lang
            pair = opus_pair_name(lang)
            tag = self.TAG.format(lang=target_lang)
            for opus_split, split in (("train", "train"), ("dev", "valid"), ("test", "test")):
                names = [f"opus.{pair}-{opus_split}.{code}" for code in (source_lang, target_lang)]
                try:
                    files = [find_file(roots, name, f"OPUS-100 {pair} {opus_split} file {name}") for name in names]
                except DataPreparationError:
                    if opus_split == "train":
                        raise
                    # OPUS-100 v1.0 has no dev/test sets for an, dz, hy, mn and yo.
                    build.steps.append(f"{source_lang}-{target_lang}: no {opus_split} set in OPUS-100, skipped")
                    continue
                label = f"{source_lang}-{target_lang}"
                sub_build = CorpusBuild(source_lang, target_lang, skips=build.skips)
                sources, targets = process_pair(options, sub_build, read_lines(files[0]), read_lines(files[1]),
                                                f"opus.{pair}-{opus_split}")
                if split == "test":
                    split = "test" if test_index == 0 else f"test{test_index}"
                    test_index += 1
                build.parts.append(Bitext(split, sources, targets, label, source_tag=tag))
        directions = ", ".join(f"{s}-{t}" for s, t in self.directions_of(options))
        build.steps.append(f"directions {directions}: train/valid concatenated, one test set per direction; "
                           + (text_steps(options, 'xx').description))
        build.steps.append("source lines prefixed with the target-language tag <2xx> after subwords")


# --- the bundled sample and your own corpus ------------------------------------------------

class HeldOutSplits:
    """Seeded valid/test sample from a single training corpus (your own corpus without dev/test)."""

    @staticmethod
    def split(sources, targets, valid_size, test_size, seed, dropped=None, unit="pairs"):
        """``dropped``: what reading dropped (a :class:`SkipCounter`), said when too little is left."""
        order = list(range(len(sources)))
        random.Random(seed).shuffle(order)
        if valid_size + test_size >= len(order):
            after = f" (after reading: {dropped.describe()})" if dropped is not None and dropped.counts else ""
            raise DataPreparationError(
                f"corpus has {len(order)} {unit}{after}: too few to hold out {valid_size} valid + {test_size} test; "
                "pass --valid-size/--test-size or --valid/--test files"
            )
        valid_ids = set(order[:valid_size])
        test_ids = set(order[valid_size:valid_size + test_size])
        chosen = {"train": [], "valid": [], "test": []}
        for index in range(len(order)):
            split = "valid" if index in valid_ids else "test" if index in test_ids else "train"
            chosen[split].append(index)
        return {split: ([sources[i] for i in ids], [targets[i] for i in ids]) for split, ids in chosen.items()}


def read_pair_files(paths, options, skips, role):
    """Raw (source, target) lines of one split given as one TSV or two aligned files, and
    what each side is called in messages."""
    paths = [Path(path) for path in paths]
    if len(paths) == 1:
        source_column, target_column = options.tsv_columns
        sources, targets = read_tsv_pairs(paths[0], skips, source_column, target_column, flag="--tsv-columns")
        return sources, targets, (f"{paths[0]} column {source_column}", f"{paths[0]} column {target_column}")
    if len(paths) == 2:
        source_lines, target_lines = read_lines(paths[0]), read_lines(paths[1])
        if len(source_lines) != len(target_lines):
            raise DataPreparationError(f"line counts differ: {paths[0]} has {len(source_lines)} lines, "
                                       f"{paths[1]} has {len(target_lines)}")
        return source_lines, target_lines, (str(paths[0]), str(paths[1]))
    raise DataPreparationError(f"--{role} takes one TSV file or two aligned files (source, target)")


def check_distinct_files(named_paths):
    """Refuse a file given twice (``named_paths``: (what, path) pairs): as both sides of a pair it
    would train copying, in two splits it would measure on training data, twice as the same input
    it would count its data twice; in no case is it what was meant."""
    seen = []
    for name, path in named_paths:
        for other_name, other in seen:
            if same_file(path, other):
                where = f"as {other_name} and as {name}" if other_name != name else f"twice to {name}"
                raise DataPreparationError(f"{path} is given {where}: give each file once")
        seen.append((name, path))


def split_files(options):
    """(flag, path) of every file given to --train/--valid/--test (a pair's two sides named apart)."""
    named = []
    for split in ("train", "valid", "test"):
        paths = getattr(options, split)
        sides = ("source", "target") if len(paths) == 2 else ("",) * len(paths)
        named += [(f"--{split} {side}".rstrip(), path) for side, path in zip(sides, paths)]
    return named


class OwnCorpus(Recipe):
    name = "custom"
    summary = "your own corpus: two aligned plain-text files or a TSV per split"
    defaults = dict(tokenizer="none", lowercase=False, subword="spm-bpe", vocab_size=8000,
                    min_len=1, max_len=250, length_ratio=1.5, clean_stage="after")
    DEFAULT_HELD_OUT = 1000
    HELD_OUT_FRACTION = 20  # at most 1/20 of the corpus each for valid and test by default

    def resolve(self, options):
        for lang, flag in ((options.source_lang, "--source-lang"), (options.target_lang, "--target-lang")):
            if not lang:
                raise DataPreparationError(f"custom corpora need {flag}")
            if not LANGUAGE_CODE.match(lang):
                raise DataPreparationError(f"unknown language code {lang!r}: use an ISO 639 code such as de or pt_BR")
        if options.source_lang == options.target_lang:
            raise DataPreparationError("--source-lang and --target-lang must differ")
        if not options.train:
            raise DataPreparationError("custom corpora need --train SRC_FILE TGT_FILE or --train FILE.tsv")
        check_distinct_files(split_files(options))
        resolved = [[Path(path).resolve() for path in paths] for paths in (options.train, options.valid, options.test)]
        return fill_defaults(replace(options, train=resolved[0], valid=resolved[1], test=resolved[2]), self.defaults)

    def input_files(self, options):
        return [path for paths in (options.train, options.valid, options.test) for path in paths]

    def build(self, options, work_dir, build):
        build.sources = [describe_input(path) for path in self.input_files(options)]
        raw = {"train": read_pair_files(options.train, options, build.skips, "train")}
        for split in ("valid", "test"):
            if getattr(options, split):
                raw[split] = read_pair_files(getattr(options, split), options, build.skips, split)
        self.add_parts(options, build, raw)

    def add_parts(self, options, build, raw):
        """``raw``: {split: (source lines, target lines, the two sides' names for messages)}."""
        processed = {split: process_pair(options, build, sources, targets, split, names=names)
                     for split, (sources, targets, names) in raw.items()}
        build.steps.append(f"pairs with an empty or non-UTF-8 side dropped; {text_steps(options, build.source_lang).description}")
        missing = [split for split in ("valid", "test") if split not in processed]
        if missing:
            limit = max(1, len(processed["train"][0]) // self.HELD_OUT_FRACTION)
            valid_size = options.valid_size if options.valid_size is not None else min(self.DEFAULT_HELD_OUT, limit)
            test_size = options.test_size if options.test_size is not None else min(self.DEFAULT_HELD_OUT, limit)
            sizes = {"valid": valid_size if "valid" in missing else 0, "test": test_size if "test" in missing else 0}
            held = HeldOutSplits.split(*processed["train"], sizes["valid"], sizes["test"], options.seed,
                                       dropped=build.skips)
            processed["train"] = held["train"]
            for split in missing:
                processed[split] = held[split]
            build.steps.append(f"held out of train with seed {options.seed}: "
                               + ", ".join(f"{split} {sizes[split]} pairs" for split in missing))
        label = f"{build.source_lang}-{build.target_lang}"
        for split in ("train", "valid", "test"):
            build.parts.append(Bitext(split, *processed[split], label))


def sample_corpus_dir(name: str, options) -> Path:
    """The bundled sample's directory (data/sample-es-en), or the one --from-archive names."""
    if len(options.from_archive) > 1:
        raise DataPreparationError(f"{name} reads one --from-archive directory (the sample's), "
                                   f"got {len(options.from_archive)}")
    directory = Path(options.from_archive[0]) if options.from_archive else shipped_dir("sample-es-en")
    if not (directory / "train.tsv.gz").is_file():
        raise DataPreparationError(
            f"sample corpus not found in {directory}: pass --from-archive path/to/data/sample-es-en "
            "(it ships in the residual-fairseq source tree and wheel)"
        )
    return directory


class SampleEsEn(OwnCorpus):
    name = "sample-es-en"
    summary = "bundled Spanish-English Bible verses (Reina-Valera 1909 / KJV), offline"
    languages = ("es", "en")
    # 2,000 pieces: on this 1.5M-word corpus a small vocabulary trains faster per CPU
    # second (the output layer dominates a 64-wide model) and to a better model.
    defaults = dict(tokenizer="none", lowercase=False, subword="spm-bpe", vocab_size=2000,
                    min_len=1, max_len=250, length_ratio=0, clean_stage="after")
    COLUMNS = {"es": 1, "en": 2}  # reference<TAB>es<TAB>en

    def resolve(self, options):
        return Recipe.resolve(self, options)

    def corpus_dir(self, options):
        return sample_corpus_dir(self.name, options)

    def input_files(self, options):
        directory = self.corpus_dir(options)
        return [directory / f"{split}.tsv.gz" for split in ("train", "valid", "test")]

    def build(self, options, work_dir, build):
        files = self.input_files(options)
        build.sources = [describe_input(path) for path in files]
        columns = (self.COLUMNS[build.source_lang], self.COLUMNS[build.target_lang])
        raw = {}
        for split, path in zip(("train", "valid", "test"), files):
            names = tuple(f"{path} column {column}" for column in columns)
            raw[split] = (*read_tsv_pairs(path, build.skips, *columns), names)
        build.steps.append("splits as shipped in data/sample-es-en (held-out books)")
        self.add_parts(options, build, raw)


RECIPES = {recipe.name: recipe for recipe in (Iwslt14(), Wmt14(), Opus100(), OwnCorpus(), SampleEsEn())}


def recipe_for(name):
    try:
        return RECIPES[name]
    except KeyError:
        raise DataPreparationError(f"unknown dataset {name!r}; choose one of {', '.join(RECIPES)}") from None
