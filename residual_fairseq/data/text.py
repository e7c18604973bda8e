"""Line-level text steps (Moses-compatible, via sacremoses) and corpus cleaning.

Each step is a small picklable object with ``__call__(line) -> line`` and a
``description`` recorded in the manifest, so the same objects serve the
single-process path (tests, 2 cores) and the multiprocessing path (``--workers N``).
"""
import multiprocessing
import re

# Below this many lines, starting worker processes costs more than it saves.
MIN_LINES_PER_WORKER = 5000
CHUNK_LINES = 2000


class _LazyStep:
    """Builds its heavy helper object on first use, and never pickles it."""

    _helper = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_helper", None)
        return state

    def helper(self):
        if self._helper is None:
            self._helper = self.build_helper()
        return self._helper


class MosesTokenize(_LazyStep):
    """tokenizer.perl -l LANG [-a]; escapes XML special characters like the perl script."""

    def __init__(self, lang, aggressive_dash_splits=False):
        self.lang = lang
        self.aggressive_dash_splits = aggressive_dash_splits
        flag = " -a" if aggressive_dash_splits else ""
        self.description = f"moses tokenize -l {lang}{flag} (sacremoses)"

    def build_helper(self):
        from sacremoses import MosesTokenizer

        return MosesTokenizer(lang=self.lang)

    def __call__(self, line):
        return self.helper().tokenize(
            line, aggressive_dash_splits=self.aggressive_dash_splits, return_str=True, escape=True
        )


class NormalizePunctuation(_LazyStep):
    """normalize-punctuation.perl LANG."""

    def __init__(self, lang):
        self.lang = lang
        self.description = f"moses normalize-punctuation {lang} (sacremoses)"

    def build_helper(self):
        from sacremoses import MosesPunctNormalizer

        return MosesPunctNormalizer(lang=self.lang)

    def __call__(self, line):
        return self.helper().normalize(line)


class RemoveNonPrinting:
    """remove-non-printing-char.perl: every Unicode 'Other' character (\\p{C}) becomes a space."""

    description = "moses remove-non-printing-char"

    def __call__(self, line):
        return "".join(" " if _is_other(ch) else ch for ch in line)


def _is_other(char):
    import unicodedata

    return unicodedata.category(char).startswith("C")


class Lowercase:
    description = "lowercase"

    def __call__(self, line):
        return line.lower()


class ReplaceCurlyApostrophe:
    """The fairseq scripts' ``sed -e "s/’/'/g"`` on dev/test sets."""

    description = "replace ’ with '"

    def __call__(self, line):
        return line.replace("\u2019", "'")


class Pipeline:
    """Steps applied in order to every line."""

    def __init__(self, steps):
        self.steps = list(steps)

    @property
    def description(self):
        return " | ".join(step.description for step in self.steps) or "no tokenization"

    def __call__(self, line):
        if line is None:  # an undecodable line keeps its slot until pairing drops it
            return None
        for step in self.steps:
            line = step(line)
        return line

    def apply_to_chunk(self, lines):
        return [self(line) for line in lines]


def map_lines(function, lines, workers=1):
    """``[function(line) for line in lines]``, spread over ``workers`` processes when it pays.

    ``function`` must be picklable and may offer ``apply_to_chunk`` for speed.
    Order is preserved.
    """
    lines = list(lines)
    apply_chunk = getattr(function, "apply_to_chunk", None) or (lambda chunk: [function(x) for x in chunk])
    workers = max(1, min(workers, len(lines) // MIN_LINES_PER_WORKER))
    if workers == 1:
        return apply_chunk(lines)
    chunks = [lines[i : i + CHUNK_LINES] for i in range(0, len(lines), CHUNK_LINES)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(apply_chunk, chunks)
    return [line for chunk in results for line in chunk]


# --- corpus cleaning -------------------------------------------------------------


def clean_corpus(sources, targets, skips, min_len=1, max_len=175, ratio=1.5):
    """Moses clean-corpus-n.perl semantics on aligned lists.

    Whitespace is collapsed and trimmed (the perl script writes the normalised
    lines too); a pair is dropped when either side has fewer than ``min_len`` or
    more than ``max_len`` space-separated tokens, or when either length divided
    by the other exceeds ``ratio``. Drops are counted as ``clean_length`` and
    ``clean_ratio``.
    """
    kept_sources, kept_targets = [], []
    for src, tgt in zip(sources, targets):
        src_tokens, tgt_tokens = src.split(), tgt.split()
        n_src, n_tgt = len(src_tokens), len(tgt_tokens)
        if not (min_len <= n_src <= max_len and min_len <= n_tgt <= max_len):
            skips.add("clean_length")
            continue
        if ratio and n_src and n_tgt and (n_src / n_tgt > ratio or n_tgt / n_src > ratio):
            skips.add("clean_ratio")
            continue
        kept_sources.append(" ".join(src_tokens))
        kept_targets.append(" ".join(tgt_tokens))
    return kept_sources, kept_targets


def every_nth_split(lines, n):
    """awk 'NR%n==0' -> held out, 'NR%n!=0' -> kept (1-based line numbers)."""
    held_out = [line for index, line in enumerate(lines, start=1) if index % n == 0]
    kept = [line for index, line in enumerate(lines, start=1) if index % n != 0]
    return kept, held_out


# --- markup of the official corpora ------------------------------------------------

IWSLT_DROPPED_LINE_TAGS = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIPPED_TAGS = re.compile(r"</?(?:title|description)>")
SEG_LINE = re.compile(r'<seg id="?[0-9]*"?>\s*(.*?)\s*</seg>\s*$')


def strip_iwslt_train_markup(lines):
    """prepare-iwslt14.sh on train.tags.*: drop url/talkid/keywords lines, strip title/description tags.

    Undecodable lines (None) pass through so the two sides stay aligned.
    """
    kept = []
    for line in lines:
        if line is not None:
            if any(tag in line for tag in IWSLT_DROPPED_LINE_TAGS):
                continue
            line = IWSLT_STRIPPED_TAGS.sub("", line)
        kept.append(line)
    return kept


def extract_segments(lines):
    """The text of every ``<seg id="N">...</seg>`` line of an IWSLT XML or WMT SGML file."""
    segments = []
    for line in lines:
        if line is None:
            segments.append(None)
            continue
        if "<seg id" not in line:
            continue
        match = SEG_LINE.search(line)
        segments.append(match.group(1) if match else re.sub(r"<seg id=[^>]*>\s*|\s*</seg>\s*", "", line))
    return segments
