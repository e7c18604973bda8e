"""Real batches from a fairseq-binarized translation data dir, via fairseq's task API."""
import argparse
import itertools
from dataclasses import fields
from pathlib import Path

from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..data.binarized import check_dictionaries, check_task_split, language_pair
from ..errors import UserError


def load_task(data_dir, source_lang=None, target_lang=None, tokens_per_sample=128):
    """A :class:`TranslationTask` over ``data_dir`` (the output of fairseq-preprocess), or a
    ``LanguageModelingTask`` for a language-model data dir (one ``dict.txt``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"data dir {data_dir} does not exist")
    check_dictionaries(data_dir)  # with one line naming a malformed one (fairseq's message spans lines)
    if (data_dir / "dict.txt").is_file() and not list(data_dir.glob("dict.*.txt")):
        if source_lang or target_lang:
            raise UserError(f"-s/-t: {data_dir} holds a language model's data (one dict.txt), not a language pair")
        return load_language_modeling_task(data_dir, tokens_per_sample)
    if not list(data_dir.glob("dict.*.txt")):
        raise UserError(f"{data_dir} has no dict.*.txt: not a fairseq-preprocess output dir")
    if source_lang or target_lang:
        # fairseq re-infers both languages when either is missing, silently dropping the one given:
        # complete (or refuse) the pair the way residual-fairseq-train does.
        source_lang, target_lang = language_pair(data_dir, source_lang, target_lang)
    # TranslationConfig's own defaults, except the few it takes from other config
    # groups by interpolation (which a plain namespace cannot resolve).
    args = argparse.Namespace(**{f.name: f.default for f in fields(TranslationConfig)})
    args.data = str(data_dir)
    args.source_lang, args.target_lang = source_lang, target_lang
    args.train_subset, args.dataset_impl, args.required_seq_len_multiple = "train", None, 1
    try:
        return TranslationTask.setup_task(args)
    except Exception as err:  # fairseq raises bare Exceptions for unknown language pairs
        raise UserError(f"cannot read {data_dir} as a translation data dir: {err}") from err


def load_language_modeling_task(data_dir, tokens_per_sample=128):
    """fairseq's language_modeling task over ``data_dir``, in blocks of ``tokens_per_sample`` tokens."""
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    args = argparse.Namespace(**{f.name: f.default for f in fields(LanguageModelingConfig)})
    args.data, args.tokens_per_sample, args.sample_break_mode = str(data_dir), tokens_per_sample, "none"
    args.seed, args.dataset_impl, args.data_buffer_size, args.tpu = 1, None, 10, False
    args.use_plasma_view, args.plasma_path, args.batch_size, args.batch_size_valid = False, None, None, None
    args.max_target_positions, args.output_dictionary_size = None, -1
    return LanguageModelingTask.setup_task(args)


def is_language_modeling(task) -> bool:
    return not hasattr(task, "src_dict")


def _iterator(task, split, max_tokens, seed, shuffle, epoch=1):
    if split not in task.datasets:
        check_task_split(task, split)  # whole and matching its dictionary: one line if not
        try:
            task.load_dataset(split)
        except FileNotFoundError as err:
            raise UserError(f"split {split!r} not found: {err}") from err
    try:
        epoch_iter = task.get_batch_iterator(
            task.dataset(split),
            max_tokens=max_tokens,
            max_positions=task.max_positions(),
            ignore_invalid_inputs=True,
            seed=seed,
            num_workers=0,  # worker processes cost seconds here and gain nothing
            epoch=epoch,
        )
    except (AssertionError, ValueError) as err:  # fairseq's batch_by_size: a sentence longer than max_tokens
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else "a sentence is longer"
        raise UserError(f"--max-tokens {max_tokens} is too small for the {split!r} split ({detail}): "
                        "raise it above the longest sentence") from None
    return epoch_iter.next_epoch_itr(shuffle=shuffle)


def measurement_batches(task, split="valid", max_tokens=4096, num_batches=4):
    """The first ``num_batches`` batches of ``split`` in fairseq's fixed (unshuffled) order."""
    batches = list(itertools.islice(_iterator(task, split, max_tokens, seed=1, shuffle=False), num_batches))
    if not batches:
        raise UserError(f"split {split!r} yielded no batches")
    return batches


def training_batches(task, split="train", max_tokens=4096, seed=1):
    """Shuffled training batches, epoch after epoch, without end."""
    for epoch in itertools.count(1):
        yielded = False
        for sample in _iterator(task, split, max_tokens, seed=seed, shuffle=True, epoch=epoch):
            yielded = True
            yield sample
        if not yielded:
            raise UserError(f"split {split!r} yielded no batches")
