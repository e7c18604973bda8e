"""A training run's record, ``SAVE_DIR/run.json``: the one place that writes and reads it.

``residual-fairseq-train`` writes it before fairseq starts (which config trained the
directory, and how: dataset, variant, depths, data, languages, seed, the extra flags and
the fairseq-train commands). Fine-tuning reads it back beside a checkpoint to find the
original config and data; train reads it to refuse resuming a save dir as another model,
and finetune to recognise its own earlier run.

A record is written atomically (:func:`~residual_fairseq.atomic.write_text_atomically`):
a crash never leaves half a record. It is read as a regular file of at most
:data:`MAX_BYTES` (a pipe would block, a device never end).
"""
import json
from pathlib import Path
from typing import Optional

from .argtypes import read_regular_file
from .atomic import write_text_atomically
from .configs import MAX_LAYERS
from .errors import UserError

RUN_RECORD_NAME = "run.json"
MAX_BYTES = 1 << 20  # a record is a few kilobytes


def record_path(save_dir) -> Path:
    return Path(save_dir) / RUN_RECORD_NAME


def write_run_record(save_dir, record: dict) -> Path:
    """Write ``record`` as ``SAVE_DIR/run.json`` (creating SAVE_DIR); returns its path."""
    path = record_path(save_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(record, indent=2) + "\n")
    return path


def _load(path: Path):
    """The JSON value stored at ``path``; OSError, ValueError or RecursionError when there is none."""
    return json.loads(read_regular_file(path, MAX_BYTES, "run record", error=OSError))


def read_any_run_record(save_dir):
    """Whatever JSON value ``SAVE_DIR/run.json`` holds, unchecked; None when there is none
    or it cannot be read as JSON. For a question one field answers (:func:`recorded_name`)."""
    try:
        return _load(record_path(save_dir))
    except (OSError, ValueError, RecursionError):
        return None


def recorded_name(save_dir) -> Optional[str]:
    """The run name (``resi_dual-6l``...) ``SAVE_DIR/run.json`` records, or None."""
    record = read_any_run_record(save_dir)
    name = record.get("name") if isinstance(record, dict) else None
    return name if isinstance(name, str) else None


def recorded_extra_args(save_dir) -> Optional[list]:
    """The fairseq flags given after ``--`` that ``SAVE_DIR/run.json`` records (its ``extra_args``),
    or None when there is no run.json or it records none (written before the record had them).
    A run.json that cannot be read, is not a JSON object, or whose ``extra_args`` is not a list of
    strings is a UserError: which flags trained the run cannot be told, and a tool comparing them
    would otherwise take it for a run trained with its own."""
    record = _read_checked(save_dir, _extra_args_problem)
    return record.get("extra_args") if record is not None else None


def _extra_args_problem(record) -> Optional[str]:
    if not isinstance(record, dict):
        return "is not a JSON object"
    extra = record.get("extra_args")
    if extra is not None and not (isinstance(extra, list) and all(isinstance(word, str) for word in extra)):
        return "has an 'extra_args' that is not a list of strings"
    return None


def read_run_record(save_dir) -> Optional[dict]:
    """``SAVE_DIR/run.json`` (None when there is none), checked: it comes with a checkpoint
    someone handed over, so one that this tool did not write is a one-line UserError."""
    return _read_checked(save_dir, run_record_problem)


def _read_checked(save_dir, problem_of) -> Optional[dict]:
    """``SAVE_DIR/run.json`` (None when there is none, or it is not a regular file: a pipe would
    block); a UserError naming it when it cannot be read or ``problem_of(record)`` names what is
    unlike a record residual-fairseq-train writes."""
    path = record_path(save_dir)
    if not path.is_file():
        return None
    try:
        record = _load(path)
    except (OSError, ValueError, RecursionError) as err:
        record, problem = None, f"cannot be read ({err.__class__.__name__})"
    else:
        problem = problem_of(record)
    if problem:
        raise UserError(f"{path} {problem}: it is not a run record residual-fairseq-train wrote")
    return record


def run_record_problem(record) -> Optional[str]:
    """What makes ``record`` unlike a run record residual-fairseq-train writes, or None."""
    if not isinstance(record, dict):
        return "is not a JSON object"
    for key in ("dataset", "variant", "data"):
        if not isinstance(record.get(key), str):
            return f"has no '{key}' string"
    for key, required in (("layers", True), ("decoder_layers", False)):
        value = record.get(key)
        if (value is not None or required) and not (type(value) is int and 1 <= value <= MAX_LAYERS):
            return f"has no '{key}' from 1 to {MAX_LAYERS}"
    return None
