"""A checkpoint file as a torch zip archive: opened once, its record layout checked (check 1).

The file must be a torch zip archive (not a legacy pickle, not some other zip): one
``<dir>/data.pkl``, uncompressed records, no duplicate names, no ``..`` or absolute
names, every record inside the file and no two sharing bytes. A device or a pipe is
refused before it is read (it would never end, or block). Only the zip's directory,
the records' headers and the pickle are read here (:class:`CheckedFile`), never the
whole file.
"""
import io
import os
import stat
import struct
import zipfile

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


MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader
_LOCAL_HEADER_MAGIC = b"PK\x03\x04"


def _open_regular(path):
    """``path`` opened for reading, refused unless it is a regular file."""
    try:
        # O_NONBLOCK: opening a named pipe would otherwise wait forever for a writer
        handle = open(path, "rb", buffering=0, opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK))
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file") from None
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise CheckpointError(f"checkpoint {path} is not a regular file")
    return handle


def starts_like_a_zip(path) -> bool:
    """Whether the file's first bytes are a zip archive's (4 bytes are read)."""
    with _open_regular(path) as handle:
        return handle.read(4) == MAGIC


class CheckedFile(io.RawIOBase):
    """A checkpoint file, opened once, that remembers every byte the checks read.

    The checks read the zip's central directory, each record's local header and the
    pickle through it (:meth:`read`); the storages are not read. Afterwards,
    :meth:`replay` gives torch a reader of the same open file in which those bytes
    are the ones that were checked, whatever changed in the file since: the pickle torch
    unpickles and the layout it reads are exactly what was checked, without holding
    the whole file in memory. (A storage's bytes may still change: they are weights.)
    """

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.handle = _open_regular(path)
        self.size = os.fstat(self.handle.fileno()).st_size
        self.position = 0
        self.checked = []  # (offset, bytes), in the order read
        self.replaying = False

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.position = base + offset
        return self.position

    def readinto(self, buffer):
        """Read into ``buffer`` (torch reads the storages so, with no copy held here)."""
        view = memoryview(buffer).cast("B")
        start = self.position
        size = max(0, min(len(view), self.size - start))
        try:
            count = os.preadv(self.handle.fileno(), [view[:size]], start) if size else 0
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err.strerror or err}") from None
        if self.replaying:
            self._put_checked_bytes(start, view[:count])
        else:
            self.checked.append((start, bytes(view[:count])))
        self.position = start + count
        return count

    def read(self, size=-1):
        start = self.position
        if size is None or size < 0:
            size = max(0, self.size - start)
        buffer = bytearray(max(0, min(size, self.size - start)))
        return bytes(buffer[:self.readinto(buffer)])

    def _put_checked_bytes(self, start, view):
        end = start + len(view)
        for offset, checked in self.checked:
            if offset < end and offset + len(checked) > start:
                low, high = max(offset, start), min(offset + len(checked), end)
                view[low - start:high - start] = checked[low - offset:high - offset]

    def replay(self):
        """From now on, reads return the checked bytes where the checks read (see the class)."""
        self.replaying = True
        self.seek(0)
        return self

    def close(self):
        self.handle.close()
        super().close()


def open_torch_zip(checked: CheckedFile, path):
    """(zip archive, record prefix) of a torch checkpoint file, its layout checked; every
    record lies inside the file, and no two records share bytes."""
    not_torch = f"checkpoint {path} is truncated or not a torch checkpoint file"
    if checked.read(4) != MAGIC:
        raise CheckpointError(not_torch + " (no zip archive: legacy pickled checkpoints are not loaded)")
    try:
        archive = zipfile.ZipFile(checked)
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
    _check_record_extents(checked, infos, path, not_torch)
    return archive, prefix


def _check_record_extents(checked, infos, path, not_torch):
    """Each record's local header names it, and its bytes lie inside the file without
    overlapping another's: the declared sizes are bytes the file really holds (else a
    small file could make torch allocate many times its size)."""
    extents = []
    for info in infos:
        checked.seek(info.header_offset)
        header = checked.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_HEADER_MAGIC:
            raise CheckpointError(f"{not_torch} (record {info.filename[:80]!r} has no local header)")
        fields = _LOCAL_HEADER.unpack(header)
        name_length, extra_length = fields[-2], fields[-1]
        if checked.read(name_length) != info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
            raise CheckpointError(f"checkpoint {path} is malformed: record {info.filename[:80]!r} is named "
                                  "otherwise in its local header")
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        end = start + info.compress_size
        if end > checked.size:
            raise CheckpointError(f"{not_torch} (record {info.filename[:80]!r} ends past the end of the file)")
        extents.append((start, end, info.header_offset, info.filename))
    extents.sort()
    for (_, end, _, first), (_, _, header, second) in zip(extents, extents[1:]):
        if header < end:
            raise CheckpointError(f"checkpoint {path} is malformed: records {first[:60]!r} and {second[:60]!r} "
                                  "overlap in its zip archive")
