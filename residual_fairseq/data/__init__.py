"""Data preparation for residual-fairseq: corpora in, fairseq-binarized data out.

Main entry points::

    from residual_fairseq.data import PrepareOptions, prepare, prepare_sample_corpus
    prepared = prepare(PrepareOptions(dataset="iwslt14-de-en", out=Path("data/iwslt14.de-en")))
    prepared.bin_dir      # pass to fairseq-train
    prepared.manifest     # what was done (also OUT/manifest.json)

The CLI (``residual-fairseq-prepare``, ``scripts/prepare.py``) is a thin layer
over :func:`prepare`. This package does not depend on the model code.
"""
from pathlib import Path

from .datasets import RECIPES
from .errors import DataPreparationError
from .language_modeling import LM_RECIPES, prepare_language_model
from .options import PrepareOptions
from .pipeline import prepare
from .prepared import PreparedData, read_manifest

__all__ = ["DataPreparationError", "LM_RECIPES", "PrepareOptions", "PreparedData", "RECIPES", "prepare",
           "prepare_language_model",
           "prepare_sample_corpus", "read_manifest"]


def prepare_sample_corpus(out, workers=1, **settings):
    """Prepare the bundled Spanish-English sample (offline) into ``out``; returns the fairseq data dir.

    ``settings`` are further :class:`PrepareOptions` fields, e.g. ``vocab_size=2000``.
    """
    return prepare(PrepareOptions(dataset="sample-es-en", out=Path(out), workers=workers, **settings)).bin_dir
