"""Fetching and unpacking source archives: resumable, verified, with progress bars.

A download goes to ``<name>.part`` and is resumed with an HTTP Range request;
only a complete (and, where a checksum is known, verified) file is renamed to
its final name. Tests never reach the network: they hand local archives in
through ``--from-archive``.
"""
import hashlib
import lzma
import os
import shutil
import socket
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

from .errors import DataPreparationError

DOWNLOAD_TIMEOUT_SECONDS = 60
BLOCK_BYTES = 1 << 20
# Disk an unpacked archive must leave free (a small archive can declare terabytes of content).
DISK_HEADROOM_BYTES = 1 << 30


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksum(path, expected_sha256):
    if expected_sha256 and sha256_of(path) != expected_sha256:
        raise DataPreparationError(
            f"checksum mismatch for {path} (expected sha256 {expected_sha256}): delete it and download again"
        )


def download(urls, destination, expected_sha256=None, progress=True):
    """Download the first URL of ``urls`` that works to ``destination``; returns the path.

    An existing complete file is reused (after the checksum check). Network
    failures fall through to the next URL; when all fail, the error names each.
    """
    destination = Path(destination)
    if destination.is_file():
        verify_checksum(destination, expected_sha256)
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            _download_resumable(url, destination, progress)
        except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            failures.append(f"{url} ({reason})")
            continue
        verify_checksum(destination, expected_sha256)
        return destination
    raise DataPreparationError(
        "download failed: " + "; ".join(failures) + " -- fetch the file yourself and pass --from-archive PATH"
    )


def _download_resumable(url, destination, progress):
    partial = destination.with_name(destination.name + ".part")
    already = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "residual-fairseq-prepare"})
    if already:
        request.add_header("Range", f"bytes={already}-")
    try:
        response = urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_SECONDS)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and already:  # range past the end: the .part file is already complete
            partial.replace(destination)
            return
        raise
    with response:
        resumed = response.status == 206
        if not resumed:
            already = 0  # server ignored the Range header: start over
        length = response.headers.get("Content-Length")
        total = already + int(length) if length is not None else None
        from tqdm import tqdm

        with open(partial, "ab" if resumed else "wb") as out, tqdm(
            total=total, initial=already, unit="B", unit_scale=True, desc=destination.name, disable=not progress
        ) as bar:
            for block in iter(lambda: response.read(BLOCK_BYTES), b""):
                out.write(block)
                bar.update(len(block))
    received = partial.stat().st_size
    if total is not None and received != total:
        raise DataPreparationError(
            f"truncated download of {url}: got {received} of {total} bytes; run again to resume"
        )
    partial.replace(destination)


def extract_archive(archive, into):
    """Unpack a .tgz/.tar/.zip archive into ``into``; a damaged archive is a one-line error.

    Damaged means any of: a truncated file, a corrupt compressed stream (gzip, bzip2, xz,
    deflate) or a checksum that does not match. tarfile stops reading at the archive's
    end marker, before the compressed stream's own checksum: the rest of the stream is
    read too, so corruption that still decompresses is caught rather than unpacked.

    Archives are untrusted: tar members go through tarfile's ``data`` filter (no absolute
    paths, ``..``, links out of ``into`` or device files), and the sizes the members
    declare (exactly what tarfile and zipfile write) must fit the free disk, less
    :data:`DISK_HEADROOM_BYTES`, before each one is written.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise DataPreparationError(f"archive not found: {archive}")
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    budget = DiskBudget(archive, into)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as bundle:
                for member in bundle.infolist():  # zipfile drops absolute paths and '..' itself
                    budget.spend(member.file_size, member.filename)
                    bundle.extract(member, into)
        else:
            with tarfile.open(archive) as bundle:
                for member in bundle:  # one pass: a .tar.gz is decompressed once
                    budget.spend(member.size if member.isfile() else 0, member.name)
                    # (a directory keeps default permissions: a read-only one would refuse its files)
                    bundle.extract(member, into, set_attrs=not member.isdir(), filter="data")
                _read_to_the_end(bundle.fileobj)
    except tarfile.FilterError as exc:
        raise DataPreparationError(f"archive {archive} holds an unsafe member, refused: "
                                   f"{' '.join(str(exc).split())}") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise DataPreparationError(
            # tarfile's message lists each method it tried, one per line: keep it one line.
            f"archive {archive} is corrupt or truncated ({type(exc).__name__}: {' '.join(str(exc).split())}); "
            "delete it and download it again"
        ) from None
    return into


def _read_to_the_end(stream):
    """Read a (decompressing) stream to its end, which checks its checksum (gzip's CRC, bzip2's,
    xz's); a plain file is only read to its end."""
    for _ in iter(lambda: stream.read(BLOCK_BYTES), b""):
        pass


class DiskBudget:
    """What an archive may still write: the free disk when unpacking starts, less the headroom."""

    def __init__(self, archive, into):
        self.archive, self.into = archive, into
        self.left = shutil.disk_usage(into).free - DISK_HEADROOM_BYTES
        self.declared = 0

    def spend(self, size, name):
        self.declared += size
        if self.declared > self.left:
            raise DataPreparationError(
                f"archive {self.archive} unpacks to more than the {max(self.left, 0) / 2**30:.1f} GiB free on "
                f"{self.into}'s disk (keeping {DISK_HEADROOM_BYTES / 2**30:.0f} GiB; at member {name!r}, "
                f"{self.declared / 2**30:.1f} GiB declared so far): free some space")


ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip", ".tar.bz2", ".tbz2", ".tar.xz")


def is_archive_name(path):
    return str(path).endswith(ARCHIVE_SUFFIXES)


def unpack_sources(paths, into):
    """Make every source readable as plain files under one searchable list of roots.

    Each path may be an archive (unpacked into ``into``) or a directory, whose
    archives are unpacked too and whose plain files are used in place.
    Returns the list of directories to search.
    """
    roots = []
    for index, path in enumerate(paths):
        path = Path(path)
        if path.is_dir():
            roots.append(path)
            for inner in sorted(path.rglob("*")):
                if inner.is_file() and is_archive_name(inner):
                    roots.append(extract_archive(inner, Path(into) / f"{index}-{inner.name}.d"))
        elif path.is_file():
            roots.append(extract_archive(path, Path(into) / f"{index}-{path.name}.d"))
        else:
            raise DataPreparationError(f"archive or directory not found: {path}")
    return roots


def find_file(roots, name, description=None):
    """The one file called ``name`` under any of ``roots`` (searched recursively)."""
    for root in roots:
        matches = sorted(Path(root).rglob(name))
        matches = [match for match in matches if match.is_file()]
        if matches:
            return matches[0]
    where = ", ".join(str(root) for root in roots)
    raise DataPreparationError(f"{description or name} not found in {where}: the archive is incomplete or not the expected one")


def default_download_dir():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "residual-fairseq" / "downloads"
