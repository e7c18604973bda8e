"""The one way the tools read fairseq-binarized data: fairseq's own tasks and batch iterators.

analyze and benchmark measure models on real batches of a ``fairseq-preprocess`` output
(or of ``residual-fairseq-prepare``'s output directory, whose binarized data is in
``bin/``): :func:`load_task` sets up fairseq's translation task, or its language_modeling
task for a directory with one ``dict.txt``, and :func:`epoch_batches` draws one epoch of
batches of a split. Each refuses what fairseq would misread with one line.
"""
import argparse
from dataclasses import fields
from pathlib import Path

from .data.binarized import check_dictionaries, check_task_split
from .errors import UserError
from .data.binarized import language_pair


def data_directory(data_dir) -> Path:
    """``data_dir``, or its ``bin/`` when it is residual-fairseq-prepare's output directory."""
    data_dir = Path(data_dir)
    if (data_dir / "bin").is_dir() and not list(data_dir.glob("dict.*")):
        return data_dir / "bin"
    return data_dir


def is_language_model_data(data_dir) -> bool:
    """fairseq's language_modeling layout: one dict.txt, no dict.<lang>.txt."""
    data_dir = Path(data_dir)
    return (data_dir / "dict.txt").is_file() and not any(data_dir.glob("dict.*.txt"))


def is_language_modeling(task) -> bool:
    return not hasattr(task, "src_dict")


def load_task(data_dir, source_lang=None, target_lang=None, tokens_per_sample=128, what="data dir"):
    """fairseq's :class:`TranslationTask` over ``data_dir``, or its ``LanguageModelingTask``
    (blocks of ``tokens_per_sample`` tokens) for a language model's data (one ``dict.txt``).

    ``what`` names the directory in messages (``--data`` for a flag). ``-s``/``-t`` are
    completed (or refused) as residual-fairseq-train does: fairseq re-infers both languages
    when either is missing, silently dropping the one given.
    """
    data_dir = data_directory(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"{what} {data_dir} does not exist: no such directory (pass a fairseq-preprocess output)")
    if not list(data_dir.glob("dict.*")):
        raise UserError(f"{what} {data_dir}: no dict.*.txt, not a fairseq-preprocess output")
    check_dictionaries(data_dir)  # with one line naming a malformed one (fairseq's message spans lines)
    if is_language_model_data(data_dir):
        if source_lang or target_lang:
            raise UserError(f"-s/-t: {data_dir} holds a language model's data (one dict.txt), not a language pair")
        return load_language_modeling_task(data_dir, tokens_per_sample)
    if not list(data_dir.glob("dict.*.txt")):
        raise UserError(f"{what} {data_dir}: no dict.*.txt, not a fairseq-preprocess output")
    if source_lang or target_lang:
        source_lang, target_lang = language_pair(data_dir, source_lang, target_lang)
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    # TranslationConfig's own defaults, except the few it takes from other config
    # groups by interpolation (which a plain namespace cannot resolve).
    args = argparse.Namespace(**{f.name: f.default for f in fields(TranslationConfig)})
    args.data = str(data_dir)
    args.source_lang, args.target_lang = source_lang, target_lang
    args.train_subset, args.dataset_impl, args.required_seq_len_multiple = "train", None, 1
    try:
        return TranslationTask.setup_task(args)
    except Exception as err:  # fairseq raises bare Exceptions for unknown language pairs
        raise UserError(f"cannot read {what} {data_dir} as a translation data dir: {err}") from err


def load_language_modeling_task(data_dir, tokens_per_sample=128):
    """fairseq's language_modeling task over ``data_dir``, in blocks of ``tokens_per_sample`` tokens."""
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    args = argparse.Namespace(**{f.name: f.default for f in fields(LanguageModelingConfig)})
    args.data, args.tokens_per_sample, args.sample_break_mode = str(data_dir), tokens_per_sample, "none"
    args.seed, args.dataset_impl, args.data_buffer_size, args.tpu = 1, None, 10, False
    args.use_plasma_view, args.plasma_path, args.batch_size, args.batch_size_valid = False, None, None, None
    args.max_target_positions, args.output_dictionary_size = None, -1
    return LanguageModelingTask.setup_task(args)


def joined_dictionary(task) -> bool:
    """True when source and target share one vocabulary, so embeddings can be shared."""
    return task.source_dictionary.symbols == task.target_dictionary.symbols


def epoch_batches(task, split, max_tokens=None, max_sentences=None, max_positions=None, seed=1, shuffle=True,
                  epoch=1):
    """An iterator over one epoch of ``split``'s batches, in fairseq's order (shuffled with
    ``seed`` and ``epoch``, or not; a new iterator every call, whatever was drawn before). ``max_positions`` None: the task's; longer sentences are
    skipped, as fairseq-train would."""
    if split not in task.datasets:
        check_task_split(task, split)  # whole and matching its dictionary: one line if not
        try:
            task.load_dataset(split)
        except FileNotFoundError as err:
            raise UserError(f"no {split!r} split in {task.cfg.data}: {err}") from err
    try:
        iterator = task.get_batch_iterator(
            dataset=task.dataset(split), max_tokens=max_tokens, max_sentences=max_sentences,
            max_positions=task.max_positions() if max_positions is None else max_positions,
            ignore_invalid_inputs=True, seed=seed,
            num_workers=0,  # worker processes cost seconds here and gain nothing
            epoch=epoch,
            # fairseq caches one iterator per dataset object and would hand back the first
            # call's (its seed, its epoch) to every later call: each call gets its own
            disable_iterator_cache=True,
        )
    except (AssertionError, ValueError) as err:  # fairseq's batch_by_size: a sentence longer than max_tokens
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else "a sentence is longer"
        raise UserError(f"--max-tokens {max_tokens} is too small for the {split!r} split ({detail}): "
                        "raise it above the longest sentence") from None
    return iterator.next_epoch_itr(shuffle=shuffle)
