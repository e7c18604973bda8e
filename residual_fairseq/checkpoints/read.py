"""Reading a checkpoint file, which is untrusted input: the one path for every loader.

:func:`read_checkpoint` opens the file once, checks it and unpickles it from the
same open file, where the bytes the checks read (the zip's directory and headers, the
pickle) are served as they were checked (:class:`~.archive.CheckedFile`): nothing that
was checked can change before it is loaded, and the file is never held in memory
whole. The checks, in order:

1. the file is a torch zip archive with torch's record layout, every record inside
   the file (:mod:`.archive`);
2. a dry unpickling of ``data.pkl`` that builds nothing: allowed globals only, storage
   records of their declared sizes, tensors inside their storages (:mod:`.scan`);
3. ``torch.load(weights_only=True)`` of the checked file, and the bytes its tensors
   reference, counted again on what was loaded;
4. the layout of a fairseq checkpoint, its config strings and its architecture (:mod:`.layout`).

Anything wrong is a :class:`~.errors.CheckpointError`: one line that names the file.
"""
import contextlib
from pathlib import Path

import torch

from .archive import CheckedFile, open_torch_zip
from .errors import CheckpointError
from .layout import check_fairseq_layout
from .scan import check_view_bytes, referenced_tensor_bytes, scan_pickle


def read_checkpoint(path) -> dict:
    """The state of a checkpoint file, as ``torch.load`` returns it, after every check above.

    The file is opened once; what is unpickled is exactly what was checked.
    """
    with open_verified(path) as (_, state):
        return state


@contextlib.contextmanager
def open_verified(path):
    """``with open_verified(path) as (file, state)``: the verified state, and the open file
    that gave it (read from it, it serves the bytes that were checked; see
    :class:`~.archive.CheckedFile`)."""
    with CheckedFile(path) as checked:
        archive, prefix = open_torch_zip(checked, path)
        stored = scan_pickle(archive, prefix, path)
        try:
            state = torch.load(checked.replay(), map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except MemoryError:
            raise CheckpointError(f"checkpoint {path} does not fit in memory") from None
        except Exception as err:  # torch's errors for bad files are many; each means "not loadable"
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            raise CheckpointError(f"cannot read checkpoint {path}: "
                                  f"{lines[-1] if lines else type(err).__name__}") from None
        check_view_bytes(referenced_tensor_bytes(state, path), stored, path)
        check_fairseq_layout(state, path)
        yield checked, state


def verify_checkpoint_file(path) -> Path:
    """Raise a one-line :class:`CheckpointError` unless ``path`` is a loadable, safe checkpoint.

    For a quick check only: a tool that loads the file uses :func:`read_checkpoint`
    (or fairseq's loader, guarded) so that what it loads is what was checked.
    """
    read_checkpoint(path)
    return Path(path)
