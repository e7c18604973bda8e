"""The files a run reads: no output of it may replace one, and fairseq must open its checkpoint by that name.

Every tool that writes files beside what it reads (evaluate's result and side files,
reproduce's tables, benchmark's and analyze's JSON) checks its outputs against its
inputs with :func:`refuse_overwriting_inputs` before it writes anything.
"""
import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from .argtypes import same_file
from .errors import UserError


@contextlib.contextmanager
def unsplittable_path(checkpoint):
    """A name for ``checkpoint`` that fairseq's ``--path`` does not split into an ensemble.

    fairseq splits ``--path`` on ``:``; a file whose path holds one is passed as a
    symlink in a temporary directory instead. (fairseq-generate, with the plugin,
    checks the file again when it opens it.)
    """
    if os.pathsep not in str(checkpoint):
        yield checkpoint
        return
    with tempfile.TemporaryDirectory(prefix="residual-fairseq-evaluate.") as tmp:
        link = Path(tmp) / "checkpoint.pt"
        link.symlink_to(Path(checkpoint).resolve())
        yield link




def refuse_overwriting_inputs(outputs, inputs, out_json, flag="--out-json") -> None:
    """UserError when a file the run would write is (or, through symlinks, resolves to) one of its inputs.

    ``outputs``: paths; ``inputs``: (description, path) pairs, e.g. ("the checkpoint", path).
    """
    for output in outputs:
        for role, path in inputs:
            if path is not None and same_file(output, path):
                written = "" if Path(output) == Path(out_json) else f" (its side file {output})"
                raise UserError(f"{flag} {out_json}{written} would overwrite {role} {path}: "
                                f"choose another result file")


# What fairseq-preprocess writes into a data directory.
_PREPROCESSED = re.compile(r"(dict.*\.txt|.*\.(bin|idx)|preprocess\.log)")


def data_input_files(data_bin, subset=None):
    """The files of the data a run reads, which no output may replace: what fairseq-preprocess wrote
    into ``data_bin`` (dictionaries, every split's .bin/.idx, its log) and, for residual-fairseq-prepare's
    ``OUT/bin``, ``OUT/manifest.json`` (evaluate reads it) and every file that manifest lists (the
    subword model, the text...). Other files there (an earlier result, notes) are not the data's.
    ``subset`` is kept for the callers' sake: every split counts."""
    data_bin = Path(data_bin)
    files = [("the data file", path) for path in _regular_files(data_bin) if _PREPROCESSED.fullmatch(path.name)]
    prepared = data_bin.resolve().parent
    manifest = prepared / "manifest.json"
    if manifest.is_file():
        files.append(("a file of the prepared data", manifest))
        try:
            listed = json.loads(manifest.read_text("utf-8")).get("files")
        except (OSError, ValueError, AttributeError, RecursionError):  # not prepare's: only the manifest itself
            listed = None
        if isinstance(listed, dict):
            files += [("a file of the prepared data", prepared / name) for name in listed
                      if isinstance(name, str) and (prepared / name).is_file()]
    return files


def _regular_files(directory: Path) -> list:
    try:
        return sorted(entry for entry in directory.iterdir() if entry.is_file())
    except OSError:  # unreadable: reading the data says so
        return []
