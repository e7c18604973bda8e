"""Which checkpoint an evaluation scores: a file, a directory's checkpoint_best.pt, or the average of its last N."""
from pathlib import Path
from typing import Optional

from ..average_checkpoints import average_last_checkpoints
from ..errors import UserError
from ..checkpoints import checkpoint_task, verify_checkpoint_file


def pick_checkpoint(checkpoint, last_n: Optional[int] = None):
    """(checkpoint file or None when averaging, checkpoint directory); reads nothing yet."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_file():
        if last_n:
            raise UserError(f"averaging the last {last_n} checkpoints needs a checkpoint directory, got a file: {checkpoint}")
        return checkpoint, checkpoint.parent
    if not checkpoint.is_dir():
        if checkpoint.exists():  # a pipe or a device
            raise UserError(f"checkpoint {checkpoint} is not a regular file")
        raise UserError(f"checkpoint not found: {checkpoint}")
    if not last_n:
        best = checkpoint / "checkpoint_best.pt"
        if not best.is_file():
            raise UserError(f"no checkpoint_best.pt in {checkpoint}: give a checkpoint file or --last-n N")
        return best, checkpoint
    if last_n < 1:
        raise UserError(f"--last-n must be at least 1, got {last_n}")
    return None, checkpoint


def resolve_checkpoint(checkpoint, last_n: Optional[int] = None, update_based: bool = False,
                       averaged_path=None):
    """The checkpoint file to evaluate and the files it was made from.

    ``checkpoint`` is a file, or a directory: its ``checkpoint_best.pt``, or with
    ``last_n`` the average of its last N epoch (or update) checkpoints, written to
    ``averaged_path`` (default ``<dir>/checkpoint.avg_last<N>[_updates].pt``).
    :func:`evaluate_run` averages beside its result file instead (``<out>.averaged.pt``).
    """
    checkpoint_file, directory = pick_checkpoint(checkpoint, last_n)
    if checkpoint_file is not None:
        return verify_checkpoint_file(checkpoint_file), [str(checkpoint_file)]
    suffix = "_updates" if update_based else ""
    averaged_path = Path(averaged_path or directory / f"checkpoint.avg_last{last_n}{suffix}.pt")
    sources = average_last_checkpoints(directory, last_n, averaged_path, update_based)
    print(f"averaged {len(sources)} checkpoints into {averaged_path}:\n  " + "\n  ".join(sources), flush=True)
    return averaged_path, sources


def check_translation_checkpoint(state: dict, checkpoint) -> None:
    """UserError when a verified checkpoint state is a language model: fairseq-generate on translation
    data would fail with a dump of size mismatches."""
    if checkpoint_task(state)[0] == "language_modeling":
        raise UserError(f"checkpoint {checkpoint} is a language model (task language_modeling), not a translation "
                        "model: evaluate it on its language-model data (a directory with one dict.txt) for its "
                        "perplexity")
