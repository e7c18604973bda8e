"""Writing files so that a crash never leaves a half-written one under the final name."""
import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_output(output):
    """Yield a temporary path beside ``output``; move it into place only if the block succeeds.

    A crash or Ctrl-C never leaves a half-written file under the final name. The
    temporary name ends in ``.tmp``: give writers that guess a format from the
    suffix (e.g. matplotlib) the format explicitly.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(handle)
    try:
        yield tmp
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomically(path, text: str) -> None:
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
