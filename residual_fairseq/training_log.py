"""What a fairseq training log (``--log-format json``) says about validations.

The train driver appends every (re)start of a run to ``SAVE_DIR/train.log``; the
reproduce report draws its curves from it and a resumed run's early stopping is
rebuilt from it (:mod:`residual_fairseq.early_stopping`).
"""
import json
import re
from pathlib import Path
from typing import List


def _valid_line(subset: str):
    return re.compile(r"\| " + re.escape(subset) + r" \| (\{.*\})\s*$")


def validation_curve(log_path: Path, subset: str = "valid") -> List[dict]:
    """(epoch, updates, loss, bleu) of every validation on ``subset``, in the log's order.

    Lines that do not parse (a damaged or edited log) are not validations.
    """
    points = []
    if not Path(log_path).is_file():
        return points
    pattern = _valid_line(subset)
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        match = pattern.search(line)
        if not match:
            continue
        try:
            stats = json.loads(match.group(1))
            bleu = stats.get(f"{subset}_bleu")
            points.append({"epoch": int(float(stats.get("epoch", 0))),
                           "updates": int(float(stats[f"{subset}_num_updates"])),
                           "loss": float(stats[f"{subset}_loss"]),
                           "bleu": float(bleu) if bleu is not None else None})
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return points
