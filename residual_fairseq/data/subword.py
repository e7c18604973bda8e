"""Subword segmentation: subword-nmt BPE or sentencepiece (BPE / unigram).

A method is learned once on the joint training text of both sides (joint
vocabulary, as the fairseq scripts do) or reused from an existing model file, then
applied line by line. Model files live in the output directory under a fixed name
so that a later preparation can reuse them (``--reuse DIR``).
"""
import contextlib
import re
from pathlib import Path

from .errors import DataPreparationError
from .text import _LazyStep

METHODS = ("bpe", "spm-bpe", "spm-unigram", "none")
BPE_CODES_NAME = "bpe.codes"
SPM_MODEL_PREFIX = "spm"  # -> spm.model, spm.vocab
# sentencepiece samples at most this many training lines (it holds them in memory).
SPM_MAX_TRAINING_SENTENCES = 10_000_000


class SubwordNmtEncode(_LazyStep):
    def __init__(self, codes_path):
        self.codes_path = str(codes_path)
        self.description = f"subword-nmt apply-bpe -c {Path(codes_path).name}"

    def build_helper(self):
        from subword_nmt.apply_bpe import BPE

        with open(self.codes_path, encoding="utf-8") as codes:
            return BPE(codes)

    def __call__(self, line):
        return self.helper().process_line(line)


class SentencePieceEncode(_LazyStep):
    def __init__(self, model_path):
        self.model_path = str(model_path)
        self.description = f"sentencepiece encode --model {Path(model_path).name} (pieces joined by spaces)"

    def build_helper(self):
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=self.model_path)

    def __call__(self, line):
        return " ".join(self.helper().encode(line, out_type=str))

    def apply_to_chunk(self, lines):
        return [" ".join(pieces) for pieces in self.helper().encode(list(lines), out_type=str)]


def method_of_model_file(path):
    """Guess the method of an existing model file: sentencepiece ``*.model`` or subword-nmt codes."""
    path = Path(path)
    if not path.is_file():
        raise DataPreparationError(f"subword model not found: {path}")
    return "spm" if path.suffix == ".model" else "bpe"


def check_model_file(path, method=None):
    """A one-line error unless ``path`` is a loadable sentencepiece model or subword-nmt codes file.

    ``method`` (``"spm"`` or ``"bpe"``) defaults to the guess from the file name.
    """
    path = Path(path)
    if (method or method_of_model_file(path)) == "spm":
        import sentencepiece

        try:
            sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise DataPreparationError(f"subword model {path} is not a sentencepiece model ({reason})") from None
        return
    # subword-nmt codes: an optional "#version: X.Y" line, then one merge ("a b") per line.
    try:
        with open(path, encoding="utf-8") as codes:
            merges = 0
            for number, line in enumerate(codes, start=1):
                if number == 1 and line.startswith("#version:"):
                    # subword-nmt parses the number itself (int() of each dotted part)
                    if not re.fullmatch(r"#version:\s*[0-9]+(\.[0-9]+)*\s*", line):
                        raise DataPreparationError(f"subword model {path} is not a subword-nmt codes file: line 1 is "
                                                   "not '#version: X.Y'")
                    continue
                if len(line.rstrip("\r\n").split(" ")) != 2:
                    raise DataPreparationError(f"subword model {path} is not a subword-nmt codes file: line {number} "
                                               "is not a merge 'a b'")
                merges += 1
    except UnicodeDecodeError:
        raise DataPreparationError(f"subword model {path} is not a subword-nmt codes file (not UTF-8 text)") from None
    if merges == 0:
        raise DataPreparationError(f"subword model {path} holds no merges")


def encoder_for(model_path):
    """The line encoder for an existing subword model file."""
    if method_of_model_file(model_path) == "spm":
        return SentencePieceEncode(model_path)
    return SubwordNmtEncode(model_path)


def learn(method, vocab_size, training_file, out_dir, workers=1, user_defined_symbols=(), progress=True):
    """Learn a subword model on ``training_file`` (both sides concatenated) into ``out_dir``.

    ``vocab_size`` is the number of merges for subword-nmt (as the fairseq
    scripts' BPE_TOKENS) and the vocabulary size for sentencepiece. Returns the
    model path and a one-line description of what was run. ``progress=False`` hides subword-nmt's bar.
    """
    out_dir = Path(out_dir)
    if method == "bpe":
        from unittest import mock

        from subword_nmt import learn_bpe as learn_bpe_module

        codes_path = out_dir / BPE_CODES_NAME
        # subword-nmt offers no switch for its tqdm bar: swap its module's tqdm for the block
        no_bar = mock.patch.object(learn_bpe_module, "tqdm", lambda iterable, *args, **kwargs: iterable)
        with open(training_file, encoding="utf-8") as infile, open(codes_path, "w", encoding="utf-8") as outfile, \
                (contextlib.nullcontext() if progress else no_bar):
            learn_bpe_module.learn_bpe(infile, outfile, vocab_size, num_workers=workers)
        return codes_path, f"subword-nmt learn-bpe -s {vocab_size} on train (both sides)"
    if method in ("spm-bpe", "spm-unigram"):
        import sentencepiece

        model_type = method.split("-", 1)[1]
        options = dict(
            input=str(training_file),
            model_prefix=str(out_dir / SPM_MODEL_PREFIX),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            input_sentence_size=SPM_MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=max(1, workers),
            # fairseq adds its own <pad>/<s>/</s>/<unk>; keep sentencepiece quiet.
            minloglevel=2,
        )
        if user_defined_symbols:
            options["user_defined_symbols"] = list(user_defined_symbols)
        try:
            sentencepiece.SentencePieceTrainer.train(**options)
        except (RuntimeError, ValueError) as exc:  # ValueError: a number sentencepiece cannot parse (> int32)
            message = str(exc).strip().splitlines()[-1]
            raise DataPreparationError(f"sentencepiece could not learn a {vocab_size} vocabulary: {message}") from None
        return (
            out_dir / f"{SPM_MODEL_PREFIX}.model",
            f"sentencepiece train --model_type {model_type} --vocab_size {vocab_size} "
            f"--character_coverage 1.0 on train (both sides)",
        )
    raise DataPreparationError(f"unknown subword method {method!r}; choose one of {', '.join(METHODS)}")
