"""The batches every variant is measured on: fairseq's own translation task and iterators.

A benchmark is only side by side if every variant sees the very same batches, so
they are drawn once, here, and handed to each measurement as a list of samples.
"""
import os
from pathlib import Path

from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..data.binarized import check_dictionaries, check_task_split
from ..errors import UserError

# Long enough for every preset; sentences beyond it are skipped, as fairseq-train would.
MAX_POSITIONS = (1024, 1024)


def load_task(data_dir, source_lang=None, target_lang=None) -> TranslationTask:
    """fairseq's translation task over a ``fairseq-preprocess`` output directory.

    The output directory of ``residual-fairseq-prepare`` also works: its binarized
    data is in ``bin/``.
    """
    data_dir = Path(data_dir)
    if (data_dir / "bin").is_dir() and not list(data_dir.glob("dict.*")):
        data_dir = data_dir / "bin"
    if not data_dir.is_dir():
        raise UserError(f"--data {data_dir}: no such directory (pass a fairseq-preprocess output)")
    if not any(name.startswith("dict.") for name in os.listdir(data_dir)):
        raise UserError(f"--data {data_dir}: no dict.*.txt, not a fairseq-preprocess output")
    check_dictionaries(data_dir)  # with one line naming a malformed one (fairseq's message spans lines)
    if is_language_model_data(data_dir):
        from ..analysis.data import load_language_modeling_task

        return load_language_modeling_task(data_dir, LM_TOKENS_PER_SAMPLE)
    # The fields that fairseq fills from its global config (II(...)) are given here.
    cfg = TranslationConfig(
        data=str(data_dir), source_lang=source_lang, target_lang=target_lang,
        train_subset="train", dataset_impl=None, required_seq_len_multiple=1,
    )
    try:
        return TranslationTask.setup_task(cfg)
    except Exception as err:  # fairseq raises bare Exceptions for unknown language pairs
        raise UserError(f"--data {data_dir}: {err}") from err


# Language models: the block length of training and of generation (decoding generates
# as many tokens as a test block holds).
LM_TOKENS_PER_SAMPLE = 64


def is_language_model_data(data_dir) -> bool:
    """fairseq's language_modeling layout: one dict.txt, no dict.<lang>.txt."""
    data_dir = Path(data_dir)
    if (data_dir / "bin").is_dir() and not list(data_dir.glob("dict.*")):
        data_dir = data_dir / "bin"
    return (data_dir / "dict.txt").is_file() and not list(data_dir.glob("dict.*.txt"))


def is_language_modeling(task) -> bool:
    return not hasattr(task, "src_dict")


def joined_dictionary(task) -> bool:
    """True when source and target share one vocabulary, so embeddings can be shared."""
    return task.source_dictionary.symbols == task.target_dictionary.symbols


def draw_batches(task, split, count, max_tokens=None, max_sentences=None, shuffle=True, seed=1):
    """The first ``count`` batches of one epoch over ``split`` (cycled if the split is smaller).

    ``count=None`` takes the whole split once, in order.
    """
    check_task_split(task, split)  # whole and matching its dictionary: one line if not
    try:
        task.load_dataset(split)
    except FileNotFoundError as err:
        raise UserError(f"no {split!r} split in {task.cfg.data}: {err}") from err
    try:
        epoch = task.get_batch_iterator(
            dataset=task.dataset(split), max_tokens=max_tokens, max_sentences=max_sentences,
            max_positions=MAX_POSITIONS, ignore_invalid_inputs=True, seed=seed, num_workers=0,
        ).next_epoch_itr(shuffle=shuffle)
    except (AssertionError, ValueError) as err:  # fairseq's batch_by_size: a sentence longer than max_tokens
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else "a sentence is longer"
        raise UserError(f"--max-tokens {max_tokens} is too small for the {split!r} split ({detail}): "
                        "raise it above the longest sentence") from None
    batches = list(epoch)
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
