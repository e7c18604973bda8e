"""A prepared data directory: its layout, its manifest, and how every recipe writes it.

The output contract shared by the translation pipeline (:mod:`.pipeline`) and the
language-model recipe (:mod:`.language_modeling`): ``--out`` may not hold the run's inputs;
an identical finished preparation (same settings, files intact) is reused; otherwise
everything is written into a staging folder beside ``--out`` and moved into place only when
complete, with ``manifest.json`` recording what was done; ``--force`` replaces only an
earlier preparation of ours that holds nothing else. Layout: :mod:`.pipeline`'s docstring.
"""
import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..argtypes import is_digits
from ..atomic import process_alive
from .datasets import LANGUAGE_CODE, check_distinct_files
from .download import sha256_of
from .errors import DataPreparationError

logger = logging.getLogger("residual_fairseq.data")

MANIFEST_NAME = "manifest.json"
LOG_NAME = "prepare.log"
BINARY_DIR = "bin"
MANIFEST_FORMAT = 1


@dataclass
class PreparedData:
    """A finished preparation: its directory, fairseq data directory and manifest."""

    out_dir: Path
    manifest: dict
    reused: bool = False  # True when an identical earlier preparation was found

    @property
    def bin_dir(self):
        return self.out_dir / BINARY_DIR


def prepare_staged(options, input_files, settings, build):
    """The output contract of every recipe (translation and language models).

    ``--out`` may not hold the run's inputs; an identical finished preparation is
    reused; otherwise ``build(staging)`` writes everything into a staging folder beside
    ``--out`` and returns the manifest, and the folder is moved into place only when
    complete (stale staging folders of killed runs are removed first).
    """
    out_dir = Path(options.out).resolve()
    check_distinct_files(("--from-archive", path) for path in options.from_archive)
    check_output_holds_no_input(out_dir, options, input_files)
    remove_stale_staging(out_dir)
    finished = existing_preparation(out_dir, settings, options.force)
    if finished:
        logger.info("%s already holds this preparation (%s); nothing to do", out_dir, MANIFEST_NAME)
        return finished

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with log_file(staging / LOG_NAME):
            manifest = build(staging)
        manifest["files"] = file_records(staging)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", "utf-8")
        move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("prepared %s in %s (fairseq data: %s)", options.dataset, out_dir, out_dir / BINARY_DIR)
    return PreparedData(out_dir, manifest)


@contextlib.contextmanager
def log_file(path):
    """Copy this package's INFO messages into ``path`` (OUT/prepare.log) while the block runs."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(logging.INFO)
    previous_level = logger.level
    if previous_level == logging.NOTSET or previous_level > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        handler.close()


def read_manifest(directory):
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise DataPreparationError(f"{path} is not a readable manifest") from None
    if not isinstance(manifest, dict):
        raise DataPreparationError(f"{path} is not a readable manifest (not a JSON object)")
    return manifest


PREPARE_MANIFEST_KEYS = ("format", "dataset", "source_lang", "target_lang", "settings", "subword", "files")


def is_prepare_manifest(manifest) -> bool:
    """Whether a manifest was written by this pipeline (rather than some other tool's manifest.json)."""
    if not isinstance(manifest, dict):
        return False
    keys = PREPARE_MANIFEST_KEYS
    if manifest.get("task") == "language_modeling":  # one language, no pair
        keys = tuple(key for key in keys if key not in ("source_lang", "target_lang"))
    if not (all(key in manifest for key in keys)
            and manifest.get("format") == MANIFEST_FORMAT and isinstance(manifest.get("files"), dict)):
        return False
    # The values readers use must have the types this pipeline writes (a planted manifest.json is
    # hostile): the subword model a plain file name beside it, never a path out of the directory.
    subword = manifest["subword"]
    model = subword.get("model") if isinstance(subword, dict) else None
    if not isinstance(subword, dict) or (model is not None and not _is_plain_file_name(model)):
        return False
    return all(isinstance(manifest[key], str) and LANGUAGE_CODE.match(manifest[key])
               for key in ("source_lang", "target_lang") if key in keys)


def _is_plain_file_name(name) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name)


def foreign_files(out_dir, manifest):
    """Files in ``out_dir`` that the preparation recorded in ``manifest`` did not write."""
    ours = set(manifest.get("files") or {}) | {MANIFEST_NAME, LOG_NAME}
    return sorted(str(path.relative_to(out_dir)) for path in Path(out_dir).rglob("*")
                  # a symlink to a directory is the user's too: --force would delete the link
                  if (path.is_symlink() or not path.is_dir()) and str(path.relative_to(out_dir)) not in ours)


def check_output_holds_no_input(out_dir, options, corpus_files):
    """--out must not be (or contain) the run's own inputs: replacing it would delete them."""
    inputs = [Path(path) for path in list(corpus_files) + list(options.from_archive)
              + [options.subword_model, options.srcdict, options.tgtdict, options.reuse, options.download_dir]
              if path is not None]
    for path in inputs:
        resolved = Path(path).resolve()
        if resolved == out_dir or out_dir in resolved.parents:
            raise DataPreparationError(f"--out {out_dir} holds an input of this run ({path}): "
                                       "choose an output directory of its own")


def remove_stale_staging(out_dir):
    """Remove ``.OUT.partial-PID`` / ``.OUT.old-PID`` folders left by killed runs (PID no longer alive)."""
    parent = out_dir.parent
    if not parent.is_dir():
        return
    for kind in ("partial", "old"):
        for folder in parent.glob(f".{out_dir.name}.{kind}-*"):
            pid = folder.name.rsplit("-", 1)[-1]
            if folder.is_dir() and is_digits(pid) and not process_alive(int(pid)):
                logger.info("removing %s, left by an interrupted run (process %s)", folder, pid)
                shutil.rmtree(folder, ignore_errors=True)


def existing_preparation(out_dir, settings, force):
    """The finished preparation in ``out_dir`` if it has exactly these settings; None if there is none.

    A directory holding anything else is an error unless ``force`` (replace it).
    """
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return None
    if not out_dir.is_dir():
        raise DataPreparationError(f"output path {out_dir} exists and is not a directory")
    manifest = read_manifest(out_dir)
    if manifest is not None and manifest.get("settings") == settings and files_intact(out_dir, manifest):
        return PreparedData(out_dir, manifest, reused=True)
    if force:
        if not is_prepare_manifest(manifest):
            raise DataPreparationError(
                f"output directory {out_dir} is not an earlier residual-fairseq-prepare output (no manifest.json of "
                "ours): --force replaces only those; choose another --out")
        foreign = foreign_files(out_dir, manifest)
        if foreign:
            raise DataPreparationError(
                f"output directory {out_dir} holds files an earlier preparation did not write ({foreign[0]}"
                + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
                + "): --force would delete them; move them or choose another --out")
        return None
    if manifest is None:
        reason = "holds other files (no manifest.json)"
    elif manifest.get("settings") != settings:
        reason = f"holds a different preparation ({manifest.get('dataset')}, other settings)"
    else:
        reason = "holds this preparation, but files are missing or changed"
    raise DataPreparationError(f"output directory {out_dir} {reason}: choose another --out or pass --force to replace it")


def files_intact(out_dir, manifest):
    records = manifest.get("files") or {}
    return bool(records) and all(
        (out_dir / name).is_file() and (out_dir / name).stat().st_size == record["bytes"]
        for name, record in records.items()
    )


def file_records(directory):
    return {
        str(path.relative_to(directory)): {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(Path(directory).rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }


def move_into_place(staging, out_dir):
    """Swap the finished staging directory in; an old directory is removed only afterwards."""
    retired = None
    if out_dir.exists():
        retired = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        out_dir.rename(retired)
    staging.rename(out_dir)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
