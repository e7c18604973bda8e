"""Loading fairseq checkpoint files with ``torch.load(weights_only=True)``.

Since torch 2.6, ``torch.load`` refuses any global that is not allowlisted, and
fairseq's checkpoints hold a few: an ``argparse.Namespace`` (CLI-trained models) and
numpy arrays in the training state (e.g. ``--eval-bleu`` statistics). Those
are allowlisted here, and nothing else: a checkpoint is an untrusted file, and the
weights-only unpickler still refuses every other global, so a crafted file cannot
run code. (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` would lift the check for every
load in the process; don't, unless you trust every file you load.)

Below that: the checks the project's CLIs run on a checkpoint file before fairseq
loads it (:func:`verify_checkpoint_file`), and the repair of a ``checkpoint_last.pt``
truncated by a crash (:func:`repair_last_checkpoint`).
"""
import argparse
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from .atomic import atomic_output
from .errors import UserError


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


def is_intact(path) -> bool:
    """True if ``path`` is a complete torch zip archive.

    A torch checkpoint is a zip file whose index sits at its end, so a file cut
    short by a crash or a full disk fails here without reading the whole file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def verify_checkpoint_file(path) -> Path:
    """Raise a one-line :class:`UserError` unless ``path`` is a loadable, safe checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if not is_intact(path):
        raise UserError(f"checkpoint {path} is truncated or not a torch checkpoint file")
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in torch.serialization.get_safe_globals()}
    unsafe = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path))) - allowed)
    if unsafe:
        raise UserError(
            f"refusing to load checkpoint {path}: it would import {', '.join(unsafe)}, "
            "which a fairseq checkpoint never needs (loading it could run code)"
        )
    arch = checkpoint_architecture(path)
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch is not None and arch not in ARCH_MODEL_REGISTRY:
        # fairseq itself dies here with "IndexError: Replacement index 1 out of range".
        raise UserError(
            f"checkpoint {path} was trained with architecture {arch!r}, which is not registered: "
            "load the plugin that defines it (fairseq: --user-dir)"
        )
    return path


def checkpoint_architecture(path):
    """The ``--arch`` (or hydra ``model._name``) a fairseq checkpoint was trained with.

    Memory-maps the file, so the weights are not read.
    """
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(state, dict):
        raise UserError(f"{path} is not a fairseq checkpoint")
    if state.get("args") is not None:
        return getattr(state["args"], "arch", None)
    model_cfg = (state.get("cfg") or {}).get("model") or {}
    get = model_cfg.get if hasattr(model_cfg, "get") else lambda key: getattr(model_cfg, key, None)
    return get("_name") or get("arch")


def repair_last_checkpoint(save_dir):
    """Make ``checkpoint_last.pt`` in ``save_dir`` loadable again after a crash.

    fairseq writes its first checkpoint file atomically (temp file + rename) but
    *copies* it to ``checkpoint_last.pt`` in place, so a kill during that copy
    leaves a truncated ``checkpoint_last.pt``. If that happened, replace it
    (atomically) with the newest intact checkpoint of the run, and return that
    file's path; return None when nothing needed repair.
    """
    save_dir = Path(save_dir)
    last = save_dir / "checkpoint_last.pt"
    if not last.exists() or is_intact(last):
        return None
    candidates = sorted(
        (p for p in save_dir.glob("checkpoint*.pt") if p != last and is_intact(p)),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    if not candidates:
        raise UserError(
            f"{last} is truncated and {save_dir} holds no intact checkpoint to resume from; "
            "move it away to start training from scratch"
        )
    with atomic_output(last) as staging:
        shutil.copyfile(candidates[0], staging)
    return candidates[0]
