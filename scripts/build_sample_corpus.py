#!/usr/bin/env python3
"""Build the bundled Spanish-English sample corpus in data/sample-es-en/.

Maintainers run this once; the output is committed, so users never need it.
It reads two public-domain Bibles from their Debian SWORD packages with pysword
(not a runtime dependency of residual-fairseq):

    apt-get install -y sword-text-sparv sword-text-kjv
    pip install pysword
    python scripts/build_sample_corpus.py            # writes data/sample-es-en/*.tsv.gz

Each split is a gzipped TSV with one verse per line: ``reference<TAB>es<TAB>en``.
Held-out *books* (not a random verse sample) form valid and test, so no chapter
is split across train and test.
"""
import argparse
import collections
import gzip
import re
from pathlib import Path

SWORD_LIBRARY = "/usr/share/sword"
SPANISH_MODULE = "spaRV1909eb"   # Reina-Valera 1909, Debian sword-text-sparv
ENGLISH_MODULE = "engKJV2006eb"  # King James Version, Debian sword-text-kjv

# Books held out of training (OSIS names). Test: narrative prose with no close
# parallel elsewhere in the NT (Acts) plus a short OT book; valid: John's gospel
# (little synoptic overlap) plus two short books.
TEST_BOOKS = ("Acts", "Ruth")
VALID_BOOKS = ("John", "Phil", "Jonah")

MARKUP_LEFTOVER = re.compile(r"[<>{}\[\]]")


def clean_verse(text):
    """Plain one-line verse text: no pilcrows, tabs, newlines or repeated spaces."""
    text = text.replace("\u00b6", " ")  # KJV paragraph marks
    # The KJV brackets a few words the translators supplied ("[but]"); keep the words.
    text = text.replace("[", "").replace("]", "")
    return " ".join(text.split())


def iter_verse_pairs(library=SWORD_LIBRARY):
    """Yield (book, reference, spanish, english) in canonical order.

    ``clean=True`` makes pysword drop the OSIS markup, including the Strong's
    number lemmas both modules carry.
    """
    from pysword.modules import SwordModules  # maintainer-only dependency

    modules = SwordModules(library)
    modules.parse_modules()
    spanish = modules.get_bible_from_module(SPANISH_MODULE)
    english = modules.get_bible_from_module(ENGLISH_MODULE)
    books = english.get_structure().get_books()
    for book in books["ot"] + books["nt"]:
        for chapter in range(1, book.num_chapters + 1):
            for verse in range(1, book.chapter_lengths[chapter - 1] + 1):
                where = dict(books=[book.osis_name], chapters=[chapter], verses=[verse], clean=True)
                es = clean_verse(spanish.get(**where))
                en = clean_verse(english.get(**where))
                yield book.osis_name, f"{book.osis_name} {chapter}:{verse}", es, en


def split_of(book):
    if book in TEST_BOOKS:
        return "test"
    if book in VALID_BOOKS:
        return "valid"
    return "train"


def build(out_dir, library=SWORD_LIBRARY):
    rows = collections.defaultdict(list)
    dropped_missing = 0
    for book, reference, es, en in iter_verse_pairs(library):
        if not es or not en:  # a verse absent from one translation
            dropped_missing += 1
            continue
        if MARKUP_LEFTOVER.search(es + en):
            raise SystemExit(f"markup left in {reference}: {es!r} / {en!r}")
        rows[split_of(book)].append(f"{reference}\t{es}\t{en}\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, lines in rows.items():
        # mtime=0 keeps the .gz bytes identical across rebuilds.
        with open(out_dir / f"{split}.tsv.gz", "wb") as raw, gzip.GzipFile(
            filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
        ) as gz:
            gz.write("".join(lines).encode("utf-8"))
    counts = {split: len(lines) for split, lines in sorted(rows.items())}
    print(f"wrote {counts} to {out_dir}; dropped {dropped_missing} verses missing on one side")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "sample-es-en")
    parser.add_argument("--sword-library", default=SWORD_LIBRARY)
    args = parser.parse_args()
    build(args.out, args.sword_library)


if __name__ == "__main__":
    main()
