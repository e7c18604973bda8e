"""Repair of a ``checkpoint_last.pt`` truncated by a crash, from the checkpoints fairseq wrote for the run."""
import re
import shutil
from pathlib import Path

from ..atomic import atomic_output
from ..errors import UserError
from .archive import is_intact, starts_like_a_zip
from .errors import CheckpointError
from .read import open_verified

# Files fairseq itself writes into a save dir for a run (checkpoint_utils.save_checkpoint).
RUN_CHECKPOINT = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+)\.pt")


def run_checkpoints(save_dir):
    """The checkpoints fairseq wrote for a run in ``save_dir`` (never averaged or other files)."""
    return [p for p in Path(save_dir).iterdir() if RUN_CHECKPOINT.fullmatch(p.name) and p.is_file()]


def repair_last_checkpoint(save_dir):
    """Make ``checkpoint_last.pt`` in ``save_dir`` loadable again after a crash.

    fairseq writes its first checkpoint file atomically (temp file + rename) but
    *copies* it to ``checkpoint_last.pt`` in place, so a kill during that copy
    leaves a truncated ``checkpoint_last.pt``. If that happened, replace it
    (atomically, with the verified bytes) by the newest valid checkpoint fairseq
    wrote for the run (``checkpointN.pt``, ``checkpoint_E_U.pt``, ``checkpoint_best.pt``;
    never ``checkpoint.avg*.pt`` or any other file), and return that file's path;
    return None when nothing needed repair.
    """
    save_dir = Path(save_dir)
    last = save_dir / "checkpoint_last.pt"
    if not last.exists() or is_intact(last) or not starts_like_a_zip(last):
        return None  # intact, or not a cut-off zip at all (that is no crash of fairseq's: an error on load)
    candidates = sorted((p for p in run_checkpoints(save_dir) if p != last), key=lambda p: p.stat().st_mtime,
                        reverse=True)
    for candidate in candidates:
        try:
            with open_verified(candidate) as (verified, _state):
                with atomic_output(last) as staging, open(staging, "wb") as copy:
                    shutil.copyfileobj(verified.replay(), copy, 1 << 20)  # the verified bytes
        except UserError:  # an unusable candidate is skipped
            continue
        return candidate
    raise CheckpointError(
        f"{last} is truncated and {save_dir} holds no intact checkpoint of the run to resume from; "
        "move it away to start training from scratch"
    )
