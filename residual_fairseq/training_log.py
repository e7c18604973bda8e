"""What a fairseq training log (``--log-format json``) says about validations.

The train driver appends every (re)start of a run to ``SAVE_DIR/train.log``; the
reproduce report draws its curves from it and a resumed run's early stopping is
rebuilt from it (:mod:`residual_fairseq.early_stopping`).
"""
import json
import re
from pathlib import Path
from typing import List, Optional, Tuple

# fairseq.trainer's lines when a (re)started fairseq-train looks for checkpoint_last.pt.
_LOADED = re.compile(r"\| fairseq\.trainer \| Loaded checkpoint .* \(epoch \d+ @ (\d+) updates\)\s*$")
_FRESH = "| fairseq.trainer | No existing checkpoint found"


def _valid_line(subset: str):
    return re.compile(r"\| " + re.escape(subset) + r" \| (\{.*\})\s*$")


def _lines(log_path: Path):
    if not Path(log_path).is_file():
        return []
    return Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()


def _validation(stats_text: str, subset: str, metric: str = "loss") -> Optional[dict]:
    """One validation's numbers; None for a line fairseq did not write (damaged or edited)."""
    try:
        stats = json.loads(stats_text)
        bleu = stats.get(f"{subset}_bleu")
        return {"epoch": int(float(stats.get("epoch", 0))),
                "updates": int(float(stats[f"{subset}_num_updates"])),
                "loss": float(stats[f"{subset}_loss"]),
                "bleu": float(bleu) if bleu is not None else None,
                "score": float(stats[f"{subset}_{metric}"])}
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None


def _history(log_path: Path, subset: str, metric: str = "loss") -> Tuple[List[dict], bool]:
    """(the validations the run in ``log_path`` has behind it, in order; whether the log
    shows where that run started).

    A log appended to by several starts keeps only the run's own history: nothing before
    the last fresh start (``No existing checkpoint found``, or a load at update 0: a
    fine-tune's first start), and at each resume (``Loaded checkpoint ... @ U updates``)
    nothing after update U, which that resume trains again.
    """
    pattern, history, started = _valid_line(subset), [], False
    for line in _lines(log_path):
        if _FRESH in line:
            history, started = [], True
            continue
        loaded = _LOADED.search(line)
        if loaded:
            updates = int(loaded.group(1))
            history = [] if updates == 0 else [point for point in history if point["updates"] <= updates]
            started = started or updates == 0
            continue
        match = pattern.search(line)
        point = _validation(match.group(1), subset, metric) if match else None
        if point is not None:
            history.append(point)
    return history, started


def validation_curve(log_path: Path, subset: str = "valid") -> List[dict]:
    """(epoch, updates, loss, bleu) of every validation of the run in ``log_path`` (see
    :func:`_history`: not an earlier run's, not those a resume trained again), in order."""
    return [{key: point[key] for key in ("epoch", "updates", "loss", "bleu")}
            for point in _history(log_path, subset)[0]]


def run_validations(log_path: Path, subset: str = "valid", metric: str = "loss",
                    up_to_updates: Optional[int] = None) -> Tuple[List[Tuple[int, float]], bool]:
    """((updates, ``metric``) of each validation of the run in ``log_path``, up to
    ``up_to_updates`` if given; whether the log shows where the run started)."""
    history, started = _history(log_path, subset, metric)
    return [(point["updates"], point["score"]) for point in history
            if up_to_updates is None or point["updates"] <= up_to_updates], started
