"""The batches an analysis measures and trains on, drawn by :mod:`residual_fairseq.fairseq_data`."""
import itertools

from ..errors import UserError
from ..fairseq_data import epoch_batches


def measurement_batches(task, split="valid", max_tokens=4096, num_batches=4):
    """The first ``num_batches`` batches of ``split`` in fairseq's fixed (unshuffled) order."""
    batches = list(itertools.islice(epoch_batches(task, split, max_tokens, seed=1, shuffle=False), num_batches))
    if not batches:
        raise UserError(f"split {split!r} yielded no batches")
    return batches


def training_batches(task, split="train", max_tokens=4096, seed=1):
    """Shuffled training batches, epoch after epoch, without end."""
    for epoch in itertools.count(1):
        yielded = False
        for sample in epoch_batches(task, split, max_tokens, seed=seed, shuffle=True, epoch=epoch):
            yielded = True
            yield sample
        if not yielded:
            raise UserError(f"split {split!r} yielded no batches")
