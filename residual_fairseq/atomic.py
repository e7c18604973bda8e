"""Writing files so that a crash never leaves a half-written one under the final name."""
import contextlib
import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process's umask (Python 3.11 has no getter that leaves it untouched)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_permissions(path, directory: bool = False) -> None:
    """The mode a plain ``open()``/``mkdir()`` would have given ``path`` under the umask.

    ``tempfile`` creates files 0600 and directories 0700; published under the final name
    as they are, a user's results would be unreadable to the group that shares them.
    """
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


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
        give_default_permissions(tmp)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomically(path, text: str) -> None:
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
