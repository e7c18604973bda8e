"""The batches every variant is measured on: fairseq's own translation task and iterators.

A benchmark is only side by side if every variant sees the very same batches, so
they are drawn once, here, and handed to each measurement as a list of samples.
"""
from ..errors import UserError
from ..fairseq_data import data_directory, epoch_batches, is_language_model_data as _is_language_model_dir
from ..fairseq_data import load_task as _load_task

# Long enough for every preset; sentences beyond it are skipped, as fairseq-train would.
MAX_POSITIONS = (1024, 1024)
# Language models: the block length of training and of generation (decoding generates
# as many tokens as a test block holds).
LM_TOKENS_PER_SAMPLE = 64


def load_task(data_dir, source_lang=None, target_lang=None):
    """fairseq's task over ``--data``: a ``fairseq-preprocess`` output directory, or
    ``residual-fairseq-prepare``'s (its binarized data is in ``bin/``); language models in
    blocks of :data:`LM_TOKENS_PER_SAMPLE` tokens."""
    return _load_task(data_dir, source_lang, target_lang, LM_TOKENS_PER_SAMPLE, what="--data")


def is_language_model_data(data_dir) -> bool:
    """``--data`` (or its ``bin/``) in fairseq's language_modeling layout: one dict.txt, no dict.<lang>.txt."""
    return _is_language_model_dir(data_directory(data_dir))


def draw_batches(task, split, count, max_tokens=None, max_sentences=None, shuffle=True, seed=1):
    """The first ``count`` batches of one epoch over ``split`` (cycled if the split is smaller).

    ``count=None`` takes the whole split once, in order.
    """
    batches = list(epoch_batches(task, split, max_tokens, max_sentences, MAX_POSITIONS, seed=seed, shuffle=shuffle))
    if not batches:
        raise UserError(f"the {split!r} split of {task.cfg.data} has no usable sentences")
    if count is None:
        return batches
    return [batches[i % len(batches)] for i in range(count)]


def first_sentences(batches, limit):
    """The leading whole batches that hold ``limit`` sentences (or just over it)."""
    kept, total = [], 0
    for batch in batches:
        if total >= limit:
            break
        kept.append(batch)
        total += batch["nsentences"]
    return kept
