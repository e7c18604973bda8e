"""Loading fairseq checkpoint files with ``torch.load(weights_only=True)``.

Since torch 2.6, ``torch.load`` refuses any global that is not allowlisted, and
fairseq's checkpoints hold a few: an ``argparse.Namespace`` (CLI-trained models) and
numpy arrays/scalars in the training state (e.g. ``--eval-bleu`` statistics). Those
are allowlisted here, and nothing else: a checkpoint is an untrusted file, and the
weights-only unpickler still refuses every other global, so a crafted file cannot
run code. (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` would lift the check for every
load in the process; don't, unless you trust every file you load.)
"""
import argparse

import numpy as np
import torch


def fairseq_checkpoint_globals():
    """The globals found in real fairseq checkpoints (measured with
    ``torch.serialization.get_unsafe_globals_in_checkpoint`` and weights-only loads):
    ``argparse.Namespace`` in every CLI-trained checkpoint, and the int64 BLEU
    statistics that ``--eval-bleu`` keeps in the saved metrics. Hydra-trained
    checkpoints need none."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    return [
        argparse.Namespace,
        np.ndarray,
        np.dtype,
        multiarray._reconstruct,
        type(np.dtype(np.int64)),  # numpy.dtypes.Int64DType
    ]


def allow_fairseq_checkpoint_globals() -> None:
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
