"""``residual-fairseq-prepare`` / ``python scripts/prepare.py``: the data preparation CLI.

A thin layer over :func:`residual_fairseq.data.prepare`; see docs/data.md.
"""
import argparse
import logging
import os
import sys
from pathlib import Path

from ..argtypes import int_at_least, nonnegative_float, nonnegative_int, positive_int, refuse_repeated_options
from ..errors import cli_main
from ..runtime import add_verbose_flag
from .datasets import RECIPES
from .language_modeling import LM_RECIPES, prepare_language_model
from .options import PrepareOptions
from .pipeline import prepare
from .subword import METHODS


def build_parser():
    datasets = "\n".join(f"  {name:15} {recipe.summary}" for name, recipe in {**RECIPES, **LM_RECIPES}.items())
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-prepare",
        description="Download (or read), clean, tokenize, segment and binarize a translation corpus "
                    "(or a language-modeling text: --dataset wikitext-103, sample-lm, custom-lm) for fairseq.",
        epilog=f"datasets:\n{datasets}\n\nDocumentation: docs/data.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", required=True, help="one of: " + ", ".join([*RECIPES, *LM_RECIPES]))
    parser.add_argument("--out", required=True, type=Path, help="output directory (created; fairseq data in OUT/bin)")
    parser.add_argument("--source-lang", "-s", help="source language (default: the dataset's direction)")
    parser.add_argument("--target-lang", "-t", help="target language")

    text = parser.add_argument_group("text processing (default: the dataset's own)")
    text.add_argument("--tokenizer", choices=("moses", "none"))
    text.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None)
    text.add_argument("--subword", choices=METHODS, help="subword-nmt BPE, sentencepiece BPE/unigram, or none")
    text.add_argument("--vocab-size", type=positive_int, help="BPE merges (bpe) or vocabulary size (sentencepiece)")
    text.add_argument("--min-len", type=nonnegative_int, help="clean-corpus-n: fewest tokens per side")
    text.add_argument("--max-len", type=positive_int, help="clean-corpus-n: most tokens per side")
    text.add_argument("--length-ratio", type=nonnegative_float,
                      help="clean-corpus-n: largest length ratio, >= 1 (0: off)")
    text.add_argument("--joined-dictionary", action=argparse.BooleanOptionalAction, default=True,
                      help="one dictionary for both sides, for shared embeddings (default: on)")

    reuse = parser.add_argument_group("feeding a new pair to a trained model")
    reuse.add_argument("--reuse", type=Path, metavar="DIR",
                       help="a previous output directory: reuse its subword model and dictionaries")
    reuse.add_argument("--subword-model", type=Path, help="existing bpe codes or sentencepiece .model")
    reuse.add_argument("--srcdict", type=Path, help="existing fairseq source dictionary")
    reuse.add_argument("--tgtdict", type=Path, help="existing fairseq target dictionary")

    own = parser.add_argument_group("your own corpus (--dataset custom)")
    for split in ("train", "valid", "test"):
        own.add_argument(f"--{split}", nargs="+", action="extend", type=Path, default=[], metavar="FILE",
                         help=f"{split} data: SRC_FILE TGT_FILE, or one TSV file (.gz allowed)")
    own.add_argument("--tsv-columns", default="0,1", help="source,target column numbers of TSV files (default 0,1)")
    own.add_argument("--valid-size", type=positive_int, help="pairs held out of train when --valid is absent")
    own.add_argument("--test-size", type=positive_int, help="pairs held out of train when --test is absent")
    own.add_argument("--seed", type=int, default=1, help="seed of the held-out sample")

    opus = parser.add_argument_group("OPUS-100 (--dataset opus-100)")
    opus.add_argument("--pairs", default="", help="languages paired with English, e.g. de,fr or en-de,en-fr")
    opus.add_argument("--directions", default="both", choices=("both", "from-en", "to-en"))

    run = parser.add_argument_group("running")
    run.add_argument("--from-archive", nargs="+", action="extend", type=Path, default=[], metavar="PATH",
                     help="use files you fetched yourself: archives or directories, instead of downloading")
    run.add_argument("--download-dir", type=Path, help="where downloads are kept and resumed "
                     "(default ~/.cache/residual-fairseq/downloads)")
    run.add_argument("--workers", type=int_at_least(1, 1024), default=os.cpu_count() or 1,
                     help="processes (default: all cores)")
    run.add_argument("--force", action="store_true", help="replace an output directory holding other data")
    run.add_argument("--quiet", action="store_true", help="no progress bars or info messages")
    add_verbose_flag(run)
    return refuse_repeated_options(parser)


def options_from_arguments(args):
    try:
        columns = tuple(int(column) for column in args.tsv_columns.split(","))
    except ValueError:
        columns = ()
    if len(columns) != 2 or min(columns) < 0 or columns[0] == columns[1]:
        from .errors import DataPreparationError

        raise DataPreparationError(f"--tsv-columns wants two different numbers >= 0 like 0,1, not {args.tsv_columns!r}")
    return PrepareOptions(
        dataset=args.dataset, out=args.out, source_lang=args.source_lang, target_lang=args.target_lang,
        tokenizer=args.tokenizer, lowercase=args.lowercase, subword=args.subword, vocab_size=args.vocab_size,
        min_len=args.min_len, max_len=args.max_len, length_ratio=args.length_ratio,
        joined_dictionary=args.joined_dictionary, reuse=args.reuse, subword_model=args.subword_model,
        srcdict=args.srcdict, tgtdict=args.tgtdict, train=args.train, valid=args.valid, test=args.test,
        tsv_columns=columns, valid_size=args.valid_size, test_size=args.test_size, seed=args.seed,
        pairs=[pair for pair in args.pairs.split(",") if pair.strip()], directions=args.directions,
        from_archive=args.from_archive, download_dir=args.download_dir, workers=args.workers,
        force=args.force, progress=not args.quiet,
    )


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    data_logger = logging.getLogger("residual_fairseq.data")
    saved_level, saved_propagate = data_logger.level, data_logger.propagate
    # --quiet silences the console only (the handler's level): OUT/prepare.log keeps the INFO lines.
    handler.setLevel(logging.WARNING if args.quiet else logging.INFO)
    data_logger.addHandler(handler)
    data_logger.setLevel(logging.WARNING if args.quiet else logging.INFO)
    data_logger.propagate = False  # fairseq configures the root logger; keep one copy of each line
    # and fairseq-preprocess's own INFO lines
    fairseq_logger = logging.getLogger("fairseq_cli.preprocess")
    saved_fairseq_level = fairseq_logger.level
    if args.quiet:
        fairseq_logger.setLevel(logging.WARNING)
    try:
        options = options_from_arguments(args)
        result = (prepare_language_model if options.dataset in LM_RECIPES else prepare)(options)
    finally:  # called in-process (tests, notebooks): leave no handler on a stream that may close
        data_logger.removeHandler(handler)
        data_logger.setLevel(saved_level)
        data_logger.propagate = saved_propagate
        fairseq_logger.setLevel(saved_fairseq_level)
    print(result.bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
