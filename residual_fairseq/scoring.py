"""Corpus scores of a translation run: sacreBLEU, chrF, and tokenized compound-split BLEU.

Two BLEU numbers, because papers report two kinds:

- **sacreBLEU** on detokenized text with sacreBLEU's own tokenizer, reported with its
  signature (``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``): the
  comparable number across papers and toolkits.
- **tokenized BLEU** on the Moses-tokenized hypotheses and references, the number of
  fairseq's ``compound_split_bleu.sh`` recipe (and of the ResiDual paper's WMT table):
  hyphenated compounds are split the way the WMT'14 en-de data of Google's
  tensor2tensor release spells them (``well-known`` -> ``well ##AT##-##AT## known``),
  then BLEU is computed on the whitespace tokens as they are (sacreBLEU with
  ``tokenize='none'`` and no smoothing, like ``multi-bleu.perl`` / ``fairseq-score``).
"""
import re
from typing import Optional, Sequence

from .errors import UserError

# compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Python's
# re.sub scans left to right without overlaps exactly like perl's s///g, so a chain
# "a-b-c" becomes "a ##AT##-##AT## b-c" in both.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """``a-b`` -> ``a ##AT##-##AT## b``, as fairseq's ``compound_split_bleu.sh`` does."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def sacrebleu_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU (default 13a tokenizer, exp smoothing) and chrF, with their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    _check_parallel(hypotheses, references)
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "sacrebleu": {
            "score": bleu_score.score,
            "signature": str(bleu.get_signature()),
            "text": str(bleu_score),
            "precisions": list(bleu_score.precisions),
            "bp": bleu_score.bp,
            "sys_len": bleu_score.sys_len,
            "ref_len": bleu_score.ref_len,
        },
        "chrf": {
            "score": chrf_score.score,
            "signature": str(chrf.get_signature()),
            "text": str(chrf_score),
        },
    }


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], compound_split: bool = False) -> dict:
    """BLEU on already (Moses-)tokenized text, optionally after compound splitting.

    No tokenization, no smoothing: the score ``multi-bleu.perl`` and ``fairseq-score``
    give on the same files.
    """
    from sacrebleu.metrics import BLEU

    _check_parallel(hypotheses, references)
    if compound_split:
        hypotheses = [split_compounds(line) for line in hypotheses]
        references = [split_compounds(line) for line in references]
    # force=True: the input is tokenized on purpose; don't warn about it.
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(list(hypotheses), [list(references)])
    return {
        "score": score.score,
        "compound_split": compound_split,
        "signature": str(bleu.get_signature()),
        "text": str(score),
        "precisions": list(score.precisions),
        "bp": score.bp,
    }


def score_translations(
    detok_hypotheses: Sequence[str],
    detok_references: Sequence[str],
    tok_hypotheses: Optional[Sequence[str]] = None,
    tok_references: Optional[Sequence[str]] = None,
    compound_split: bool = False,
) -> dict:
    """All scores of one run: sacreBLEU + chrF on detokenized text, and tokenized BLEU
    (compound-split if asked) when the tokenized text is given."""
    scores = sacrebleu_scores(detok_hypotheses, detok_references)
    if tok_hypotheses is not None and tok_references is not None:
        scores["tokenized_bleu"] = tokenized_bleu(tok_hypotheses, tok_references, compound_split)
    return scores


def _check_parallel(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypotheses but {len(references)} references: the files must be parallel")
    if not hypotheses:
        raise UserError("nothing to score: no hypotheses")

