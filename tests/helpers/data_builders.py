"""Builders of miniature corpora in the real archive formats, for the data tests (no tests here).

Each writes the same layout and markup as the official archive (tagged IWSLT
train files, XML/SGML dev and test sets, OPUS-100 per-pair trees), with
sentences generated so that the tests can name concrete lines.
"""
import io
import tarfile
from pathlib import Path

GERMAN_WORDS = "haus baum katze hund auto stadt fluss berg weg licht".split()
ENGLISH_WORDS = "house tree cat dog car town river hill way light".split()


def numbered_pair(index):
    """A German/English sentence pair unique to ``index`` (same number of words)."""
    picks = [(index * 7 + k * 3) % len(GERMAN_WORDS) for k in range(4)]
    german = f"Satz {index} : " + " ".join(GERMAN_WORDS[i] for i in picks) + "."
    english = f"Sentence {index} : " + " ".join(ENGLISH_WORDS[i] for i in picks) + "."
    return german, english


def add_text(bundle, name, text):
    data = text.encode("utf-8") if isinstance(text, str) else text
    info = tarfile.TarInfo(name)
    info.size = len(data)
    bundle.addfile(info, io.BytesIO(data))


def write_tgz(path, files):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as bundle:
        for name, text in files.items():
            add_text(bundle, name, text)
    return path


# --- IWSLT'14 -----------------------------------------------------------------------------

IWSLT_TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                   "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
IWSLT_TRAIN_PAIRS = 60
IWSLT_LONG = ("wort " * 180).strip()                 # 180 tokens: over the 175 limit
IWSLT_RATIO = ("ein zwei drei vier", "one")          # 4 vs 1 tokens: ratio 4 > 1.5


def iwslt_train_lines():
    """(de, en) lines of train.tags.de-en.*: talk headers, then numbered pairs and two to be cleaned."""
    lines = [
        ("<url>http://www.ted.com/talks/a.html</url>", "<url>http://www.ted.com/talks/a.html</url>"),
        ("<keywords>talks, science</keywords>", "<keywords>talks, science</keywords>"),
        ("<talkid>1</talkid>", "<talkid>1</talkid>"),
        ("<title>Ein Titel</title>", "<title>A Title</title>"),
        ("<description>Eine Beschreibung</description>", "<description>A Description</description>"),
    ]
    lines += [numbered_pair(index) for index in range(1, IWSLT_TRAIN_PAIRS + 1)]
    lines += [(IWSLT_LONG, "word " * 3), IWSLT_RATIO]
    return lines


def iwslt_xml(lang, test_set, segments):
    body = "\n".join(f'<seg id="{i}"> {text} </seg>' for i, text in enumerate(segments, start=1))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="{test_set}" srclang="{lang}">\n'
            f'<doc docid="1" genre="lectures">\n<url>http://www.ted.com/talks/b.html</url>\n'
            f"<talkid>2</talkid>\n{body}\n</doc>\n</srcset>\n</mteval>\n")


def iwslt_test_segments(test_set):
    """Two segments per test set; the first has a curly apostrophe."""
    return {"de": [f"Das ist’s, {test_set}!", "Guten Morgen."], "en": [f"That’s it, {test_set}!", "Good morning."]}


def build_iwslt_archive(path):
    train = iwslt_train_lines()
    files = {f"de-en/train.tags.de-en.{lang}": "\n".join(pair[side] for pair in train) + "\n"
             for side, lang in enumerate(("de", "en"))}
    for test_set in IWSLT_TEST_SETS:
        for lang in ("de", "en"):
            files[f"de-en/{test_set}.de-en.{lang}.xml"] = iwslt_xml(lang, test_set, iwslt_test_segments(test_set)[lang])
    return write_tgz(path, files)


# --- WMT'14 -------------------------------------------------------------------------------

WMT_CORPORA = {  # archive -> member prefix; 100 + 100 + 60 = 260 lines in this order
    "training-parallel-europarl-v7.tgz": ("training/europarl-v7.de-en", 100),
    "training-parallel-commoncrawl.tgz": ("commoncrawl.de-en", 100),
    "training-parallel-nc-v9.tgz": ("training/news-commentary-v9.de-en", 60),
}
WMT_SPECIAL_LINE = 5  # europarl line 5 carries the punctuation/hyphen/non-printing cases
WMT_SPECIAL = ("Er sagte „ja“ zum State-of-the-Art\u200bModell.", "He said “yes” to the state-of-the-art\u200bmodel.")
WMT_LONG_LINE = 7     # europarl line 7: 260 tokens, over the 250 limit
WMT_EMPTY_LINE = 9    # europarl line 9: empty on the German side


def wmt_corpus_lines(prefix, count):
    lines = []
    for index in range(1, count + 1):
        german, english = numbered_pair(index)
        tag = prefix.rsplit("/", 1)[-1].split(".")[0].split("-")[0]  # europarl, commoncrawl, news
        german, english = f"{tag} {german}", f"{tag} {english}"
        if prefix.endswith("europarl-v7.de-en"):
            if index == WMT_SPECIAL_LINE:
                german, english = WMT_SPECIAL
            elif index == WMT_LONG_LINE:
                german, english = ("lang " * 260).strip(), ("long " * 260).strip()
            elif index == WMT_EMPTY_LINE:
                german = ""
        lines.append((german, english))
    return lines


def wmt_sgm(lang, role, segments):
    body = "\n".join(f'<seg id="{i}">{text}</seg>' for i, text in enumerate(segments, start=1))
    return (f'<{role}set setid="newstest2014" srclang="any" trglang="{lang}">\n'
            f'<doc sysid="{role}" docid="1" genre="news" origlang="en">\n<p>\n{body}\n</p>\n</doc>\n</{role}set>\n')


WMT_TEST = {"en": ["It’s a well-known fact.", "Second line."], "de": ["Es ist eine bekannte Tatsache.", "Zweite Zeile."]}


def build_wmt_archives(directory):
    directory = Path(directory)
    for archive, (prefix, count) in WMT_CORPORA.items():
        lines = wmt_corpus_lines(prefix, count)
        write_tgz(directory / archive, {f"{prefix}.{lang}": "\n".join(pair[side] for pair in lines) + "\n"
                                        for side, lang in enumerate(("de", "en"))})
    write_tgz(directory / "test-full.tgz", {
        "test-full/newstest2014-deen-src.en.sgm": wmt_sgm("en", "src", WMT_TEST["en"]),
        "test-full/newstest2014-deen-ref.de.sgm": wmt_sgm("de", "ref", WMT_TEST["de"]),
    })
    return directory


# --- OPUS-100 -------------------------------------------------------------------------------

OPUS_FRENCH_WORDS = "maison arbre chat chien voiture ville fleuve colline chemin lumière".split()


def opus_pair(lang, index):
    words = GERMAN_WORDS if lang == "de" else OPUS_FRENCH_WORDS
    picks = [(index * 7 + k * 3) % len(words) for k in range(4)]
    return " ".join(words[i] for i in picks) + f" {index}", " ".join(ENGLISH_WORDS[i] for i in picks) + f" {index}"


def build_opus_archives(directory, langs=("de", "fr"), counts=None):
    """One opus-100-corpus-<pair>-v1.0.tar.gz per language, in the official tree."""
    counts = counts or {"train": 40, "dev": 4, "test": 3}
    directory = Path(directory)
    for lang in langs:
        pair = "-".join(sorted(("en", lang)))
        files = {}
        for split, count in counts.items():
            lines = [opus_pair(lang, index) for index in range(1, count + 1)]
            stem = f"opus-100-corpus/v1.0/supervised/{pair}/opus.{pair}-{split}"
            files[f"{stem}.{lang}"] = "\n".join(line[0] for line in lines) + "\n"
            files[f"{stem}.en"] = "\n".join(line[1] for line in lines) + "\n"
        write_tgz(directory / f"opus-100-corpus-{pair}-v1.0.tar.gz", files)
    return directory


# --- your own corpus ------------------------------------------------------------------------

def write_plain_pair(directory, count, stem="corpus", extra=()):
    """SRC/TGT files ``stem.de``/``stem.en`` with ``count`` numbered pairs, then ``extra`` raw byte pairs."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pairs = [tuple(side.encode() for side in numbered_pair(index)) for index in range(1, count + 1)] + list(extra)
    (directory / f"{stem}.de").write_bytes(b"".join(pair[0] + b"\n" for pair in pairs))
    (directory / f"{stem}.en").write_bytes(b"".join(pair[1] + b"\n" for pair in pairs))
    return directory / f"{stem}.de", directory / f"{stem}.en"


def write_tsv(path, start, count):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(numbered_pair(index)) + "\n" for index in range(start, start + count)), "utf-8")
    return path
