"""Writing files so that a crash never leaves a half-written one under the final name."""
import contextlib
import logging
import os
import re
import socket
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
# What follows ``.OUTPUT_NAME`` in a temporary's name: the writer's host and process, then
# tempfile's 8 random characters. A writer killed outright (SIGKILL, a lost machine) leaves
# its temporary behind; the next write of the same output removes it once its process is gone.
_TEMPORARY_TAIL = re.compile(r"\.(?P<host>.+)-(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp")


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


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process (or no such pid number)
        return True
    return True


def remove_abandoned_temporaries(output) -> list:
    """Remove the temporaries of ``output`` that writers on this machine left when they were
    killed (their process no longer exists); return their paths. Nothing else is touched:
    a name must be exactly what :func:`atomic_output` gives, from this host, by a dead process."""
    output, host, removed = Path(output), socket.gethostname(), []
    prefix = f".{output.name}"
    try:
        entries = list(os.scandir(output.parent))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY_TAIL.fullmatch(entry.name[len(prefix):]) if entry.name.startswith(prefix) else None
        if match is None or match["host"] != host or process_alive(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
                logger.info("removed %s, left by a killed writer", entry.path)
    return removed


@contextlib.contextmanager
def atomic_output(output):
    """Yield a temporary path beside ``output``; move it into place only if the block succeeds.

    A crash or Ctrl-C never leaves a half-written file under the final name. The
    temporary name ends in ``.tmp``: give writers that guess a format from the
    suffix (e.g. matplotlib) the format explicitly. It names this host and process, so
    that a temporary left by a killed writer is removed by the next write of ``output``
    (:func:`remove_abandoned_temporaries`).
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temporaries(output)
    handle, tmp = tempfile.mkstemp(prefix=f".{output.name}.{socket.gethostname()}-{os.getpid()}.", suffix=".tmp",
                                   dir=output.parent)
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
