"""What a dataset recipe hands to the shared pipeline: aligned bitexts per split."""
from dataclasses import dataclass, field
from typing import List, Optional

from .textio import SkipCounter


@dataclass
class Bitext:
    """One aligned part of a split, already tokenized (and cleaned, if the recipe cleans early).

    ``split`` is fairseq's split name (train, valid, test, test1, ...); parts
    with the same split are concatenated in order. ``source_tag`` (e.g.
    ``<2de>``) is prepended to every source line after subword segmentation, so
    subword models never split it.
    """

    split: str
    source: List[str]
    target: List[str]
    label: str
    source_tag: Optional[str] = None


@dataclass
class Cleaning:
    """clean-corpus-n parameters and when they apply (``before`` or ``after`` subwords)."""

    stage: str
    min_len: int = 1
    max_len: int = 175
    ratio: Optional[float] = 1.5
    splits: tuple = ("train",)

    def describe(self):
        ratio = f" -ratio {self.ratio}" if self.ratio else ""
        return (f"clean-corpus-n{ratio} {self.min_len} {self.max_len} on {'+'.join(self.splits)} "
                f"({self.stage} subwords)")


@dataclass
class CorpusBuild:
    """A recipe's result: bitexts, the steps it ran, its sources, skipped pairs and the language pair."""

    source_lang: str
    target_lang: str
    parts: List[Bitext] = field(default_factory=list)
    steps: List[str] = field(default_factory=list)
    sources: List[dict] = field(default_factory=list)
    skips: SkipCounter = field(default_factory=SkipCounter)
