"""Reading a checkpoint file, which is untrusted input: the one path for every loader.

:func:`read_checkpoint` reads the file once into memory, checks it and unpickles it
from those same bytes, so nothing can change between check and load. The checks, in
order:

1. the bytes are a torch zip archive with torch's record layout (:mod:`.archive`);
2. a dry unpickling of ``data.pkl`` that builds nothing: allowed globals only, storage
   records of their declared sizes, tensors inside their storages (:mod:`.scan`);
3. ``torch.load(weights_only=True)`` of the in-memory bytes, and the bytes its tensors
   reference, counted again on what was loaded;
4. the layout of a fairseq checkpoint, its config strings and its architecture (:mod:`.layout`).

Anything wrong is a :class:`~.errors.CheckpointError`: one line that names the file.
"""
import io
from pathlib import Path

import torch

from .archive import open_torch_zip, read_file_once
from .errors import CheckpointError
from .layout import check_fairseq_layout
from .scan import check_view_bytes, referenced_tensor_bytes, scan_pickle


def read_checkpoint(path) -> dict:
    """The state of a checkpoint file, as ``torch.load`` returns it, after every check above.

    The file is read once; what is unpickled is exactly what was checked.
    """
    return read_verified(path)[1]


def read_verified(path):
    """(the file's bytes, its verified state)."""
    data = read_file_once(path)
    archive, prefix = open_torch_zip(data, path)
    stored = scan_pickle(archive, prefix, path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch's errors for bad files are many; each means "not loadable"
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise CheckpointError(f"cannot read checkpoint {path}: {lines[-1] if lines else type(err).__name__}") from None
    check_view_bytes(referenced_tensor_bytes(state, path), stored, path)
    check_fairseq_layout(state, path)
    return data, state


def verify_checkpoint_file(path) -> Path:
    """Raise a one-line :class:`CheckpointError` unless ``path`` is a loadable, safe checkpoint.

    For a quick check only: a tool that loads the file uses :func:`read_checkpoint`
    (or fairseq's loader, guarded) so that what it loads is what was checked.
    """
    read_checkpoint(path)
    return Path(path)
