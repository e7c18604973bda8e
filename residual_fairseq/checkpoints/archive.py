"""A checkpoint file as a torch zip archive: read once, its record layout checked (check 1).

The bytes must be a torch zip archive (not a legacy pickle, not some other zip): one
``<dir>/data.pkl``, uncompressed records, no duplicate names, no ``..`` or absolute
names. A device or a pipe is refused before it is read (it would never end, or block).
"""
import io
import os
import stat
import zipfile
from pathlib import Path

from .errors import CheckpointError


def is_intact(path) -> bool:
    """True if ``path`` is a complete zip archive (a crash while writing leaves no index)."""
    refuse_irregular(path)  # zipfile would read a device to its (never) end, or block on a pipe
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError):
        return False



def refuse_irregular(path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # (missing, a link loop...: the reader's own error names it)
    if stat.S_ISDIR(mode):
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file")
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"checkpoint {path} is not a regular file")


def read_file_once(path) -> bytes:
    """The checkpoint file's bytes, read once (or only its first 4 when they show it is no zip)."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a named pipe would otherwise wait forever for a writer
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise CheckpointError(f"checkpoint {path} is not a regular file")
            magic = handle.read(4)
            if magic != b"PK\x03\x04":  # before reading gigabytes of something else into memory
                return magic
            return magic + handle.read()
    except MemoryError:
        raise CheckpointError(f"checkpoint {path} does not fit in memory") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file") from None
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None


def open_torch_zip(data: bytes, path):
    """(zip archive, record prefix) of a torch checkpoint's bytes."""
    not_torch = f"checkpoint {path} is truncated or not a torch checkpoint file"
    if not data.startswith(b"PK\x03\x04"):
        raise CheckpointError(not_torch + " (no zip archive: legacy pickled checkpoints are not loaded)")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError):
        raise CheckpointError(not_torch) from None
    names = [info.filename for info in infos]
    pickles = [name for name in names if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise CheckpointError(f"{not_torch} (a zip archive without exactly one <dir>/data.pkl)")
    prefix = pickles[0][: -len("data.pkl")]
    if len(set(names)) != len(names):
        raise CheckpointError(f"checkpoint {path} is malformed: duplicate names in its zip archive")
    for info in infos:
        name = info.filename
        if not name.startswith(prefix) or "\\" in name or any(part in ("", ".", "..") for part in name.split("/")):
            raise CheckpointError(f"checkpoint {path} is malformed: unexpected record name {name[:80]!r}")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise CheckpointError(f"checkpoint {path} is malformed: compressed record {name[:80]!r} "
                                  "(torch never compresses)")
    return archive, prefix

