"""Everything a preparation can be told, with one meaning per field.

``None`` means "the dataset's default"; :func:`residual_fairseq.data.datasets`
recipes fill those in, and the filled-in settings are what the manifest records
and what a re-run is compared against.
"""
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

# Fields that change how a preparation runs but not what it produces: they are
# left out of the manifest's settings, so changing them keeps a re-run a no-op.
RUN_ONLY_FIELDS = ("out", "force", "workers", "download_dir", "progress", "from_archive")


@dataclass
class PrepareOptions:
    dataset: str
    out: Path
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None
    # Text processing (None: the dataset's default).
    tokenizer: Optional[str] = None          # "moses" or "none"
    lowercase: Optional[bool] = None
    subword: Optional[str] = None            # bpe, spm-bpe, spm-unigram, none
    vocab_size: Optional[int] = None         # merges for bpe, vocabulary size for sentencepiece
    min_len: Optional[int] = None
    max_len: Optional[int] = None
    length_ratio: Optional[float] = None     # 0 disables the ratio filter
    joined_dictionary: bool = True
    # Reusing a trained model's segmentation and vocabulary.
    reuse: Optional[Path] = None             # a previous output directory
    subword_model: Optional[Path] = None
    srcdict: Optional[Path] = None
    tgtdict: Optional[Path] = None
    # Your own corpus: 1 path (TSV) or 2 paths (source, target) per split.
    train: List[Path] = field(default_factory=list)
    valid: List[Path] = field(default_factory=list)
    test: List[Path] = field(default_factory=list)
    tsv_columns: tuple = (0, 1)
    valid_size: Optional[int] = None
    test_size: Optional[int] = None
    seed: int = 1
    # OPUS-100.
    pairs: List[str] = field(default_factory=list)
    directions: str = "both"                 # both, from-en, to-en
    # Running.
    from_archive: List[Path] = field(default_factory=list)
    download_dir: Optional[Path] = None
    workers: int = 1
    force: bool = False
    progress: bool = True

    def settings(self):
        """The JSON-able settings that determine the output (see RUN_ONLY_FIELDS)."""
        values = asdict(self)
        for name in RUN_ONLY_FIELDS:
            values.pop(name)
        return {key: _jsonable(value) for key, value in values.items()}


def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value
