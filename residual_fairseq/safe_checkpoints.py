"""Opening fairseq checkpoint files, which are untrusted input.

One path for every loader (:func:`read_checkpoint`): the file is read once into
memory, checked, and unpickled from those same bytes, so nothing can change between
check and load. The checks, in order:

1. the bytes are a torch zip archive (not a legacy pickle, not some other zip): one
   ``<dir>/data.pkl``, uncompressed records, no duplicate names, no ``..`` or absolute
   names;
2. a dry unpickling of ``data.pkl`` that builds nothing: every global must be one a
   fairseq checkpoint holds (tensors, ``OrderedDict``, ``argparse.Namespace``, numpy's
   int64 metrics), every storage key is a plain name whose record holds exactly the
   declared number of bytes, and every tensor fits inside its storage (no stride-0
   views declaring terabytes), with all tensors together at most
   :data:`MAX_VIEW_BYTES_PER_STORED_BYTE` times the stored bytes;
3. ``torch.load(weights_only=True)`` of the in-memory bytes;
4. the layout of a fairseq checkpoint (a dict with known entries, ``model`` a dict
   of tensors, ``args`` an ``argparse.Namespace`` or ``cfg`` a dict, plain values
   only, no omegaconf ``${...}`` interpolations), the string options that fairseq
   evaluates parse as literals (:mod:`.config_strings`), and the architecture is
   registered.

Then, where fairseq would build the model (:func:`prepare_for_fairseq`), the config
must fit the weights: its layer counts are at most the stored layers, and the model it
describes, built on the meta device (nothing allocated), has the stored shapes and at
most about twice the stored parameters (:func:`check_config_fits_weights`): otherwise
a 10 MB file could ask for hundreds of GB. Options that only initialise weights from
a file (``admin_profile``, ``*_embed_path``) are cleared, because the checkpoint's
weights replace what they would load.

Anything wrong is a :class:`CheckpointError`: one line that names the file.

Importing ``residual_fairseq`` (``--user-dir`` does) installs :func:`load_checkpoint_to_cpu`
as fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``, the function through which
fairseq-generate, fairseq-interactive, hub ``from_pretrained`` and training resume
open checkpoint files, so they get the same checks.

Also here: the repair of a ``checkpoint_last.pt`` truncated by a crash
(:func:`repair_last_checkpoint`), using only checkpoints fairseq wrote for the run.
"""
import argparse
import collections
import contextlib
import copy
import functools
import io
import logging
import math
import os
import pickle
import re
import stat
import threading
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from .atomic import atomic_output
from .config_strings import CodeInConfigError, check_config_strings, close_fairseq_eval_calls
from .errors import UserError

# Tensors may view the same storage (tied embeddings: 3 views of one table), but not
# so often that copying them (averaging does) needs far more memory than the file.
MAX_VIEW_BYTES_PER_STORED_BYTE = 8
# Checkpoint entries fairseq writes (trainer.state_dict) or upgrades from old formats.
FAIRSEQ_ENTRIES = frozenset({
    "args", "cfg", "model", "criterion", "optimizer_history", "task_state", "extra_state",
    "last_optimizer_state", "ema", "fsdp_metadata",
    "optimizer", "best_loss", "epoch", "batch_offset", "val_loss",  # fairseq < 0.6, upgraded on load
})
# Files fairseq itself writes into a save dir for a run (checkpoint_utils.save_checkpoint).
RUN_CHECKPOINT = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+)\.pt")
MAX_CONFIG_NODES = 100_000
MAX_CONFIG_DEPTH = 32  # fairseq nests configs 3-4 deep; omegaconf recurses once per level
_STORAGE_KEY = re.compile(r"[A-Za-z0-9_]+")


class CheckpointError(UserError):
    """A checkpoint file is unreadable, malformed or unsafe; the message names the file."""


def fairseq_checkpoint_globals():
    """The globals found in real fairseq checkpoints (measured with
    ``torch.serialization.get_unsafe_globals_in_checkpoint`` and weights-only loads):
    ``argparse.Namespace`` in every CLI-trained checkpoint, and the int64 BLEU
    statistics that ``--eval-bleu`` keeps in the saved metrics. Hydra-trained
    checkpoints need none."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    return [
        argparse.Namespace,
        np.ndarray,
        np.dtype,
        multiarray._reconstruct,
        type(np.dtype(np.int64)),  # numpy.dtypes.Int64DType
    ]


def allow_fairseq_checkpoint_globals() -> None:
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())


def is_intact(path) -> bool:
    """True if ``path`` is a complete zip archive (a crash while writing leaves no index)."""
    _refuse_irregular(path)  # zipfile would read a device to its (never) end, or block on a pipe
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


# --- 1. read once, check the zip layout -------------------------------------------------------


def _refuse_irregular(path) -> None:
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


def _open_torch_zip(data: bytes, path):
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


# --- 2. dry unpickling: globals, storages, declared tensor sizes --------------------------------


class _Storage:
    def __init__(self, key, dtype, numel):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Placeholder:
    """Stands for whatever a reduce would build; nothing is built during the scan."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


def _storage_types():
    types = {"torch.storage.UntypedStorage": torch.uint8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
                     "ComplexFloat", "ComplexDouble"):
            dtype = getattr(torch, f"{name}Storage").dtype
            types[f"torch.{name}Storage"] = types[f"torch.cuda.{name}Storage"] = dtype
    return types


_STORAGE_TYPES = _storage_types()


class _ScanningUnpickler(pickle.Unpickler):
    """Walks ``data.pkl`` like torch's loader would, building placeholders only."""

    def __init__(self, data, path, records, prefix):
        super().__init__(io.BytesIO(data))
        self.path, self.records, self.prefix = path, records, prefix
        self.storages = {}
        self.view_bytes = 0

    def refuse(self, why):
        raise CheckpointError(f"refusing to load checkpoint {self.path}: {why}")

    def find_class(self, module, name):
        qualified = f"{module}.{name}"
        if qualified in _STORAGE_TYPES:
            return qualified
        allowed = {
            "collections.OrderedDict": collections.OrderedDict,
            "argparse.Namespace": argparse.Namespace,
            "torch._utils._rebuild_tensor_v2": self.rebuild_tensor,
            "torch._utils._rebuild_parameter": lambda data, *args: data,
            "_codecs.encode": _Placeholder,
            "builtins.set": set,
            "builtins.complex": complex,
            "numpy.ndarray": _Placeholder,
            "numpy.dtype": self.numpy_dtype,
            "numpy.core.multiarray._reconstruct": _Placeholder,
            "numpy._core.multiarray._reconstruct": _Placeholder,
            "numpy.dtypes.Int64DType": _Placeholder,
        }
        if qualified not in allowed:
            self.refuse(f"it would import {qualified}, which a fairseq checkpoint never needs "
                        "(loading it could run code)")
        return allowed[qualified]

    def numpy_dtype(self, spec, *args):
        if not (isinstance(spec, str) and re.fullmatch(r"[<>|=]?[biuf]\d+", spec)):
            self.refuse(f"it holds a numpy array of dtype {str(spec)[:20]!r}; fairseq checkpoints hold only "
                        "numeric numpy arrays (object arrays can run code)")
        return _Placeholder()

    def persistent_load(self, saved_id):
        if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[0] == "storage"):
            self.refuse("it holds a persistent reference that is not a torch storage")
        _, storage_type, key, _location, numel = saved_id
        if storage_type not in _STORAGE_TYPES:
            self.refuse(f"unknown storage type {str(storage_type)[:40]!r}")
        if not (isinstance(key, str) and _STORAGE_KEY.fullmatch(key)):
            self.refuse(f"storage key {str(key)[:40]!r} is not a plain name")
        if not isinstance(numel, int) or numel < 0:
            self.refuse(f"storage {key} declares {numel!r} elements")
        dtype = _STORAGE_TYPES[storage_type]
        declared = numel * torch.empty((), dtype=dtype).element_size()
        record = self.records.get(f"{self.prefix}data/{key}")
        if record is None:
            self.refuse(f"storage {key} has no data record")
        if record.file_size != declared:
            self.refuse(f"storage {key} declares {declared} bytes but its record holds {record.file_size}")
        known = self.storages.setdefault(key, _Storage(key, dtype, numel))
        if (known.dtype, known.numel) != (dtype, numel):
            self.refuse(f"storage {key} is declared twice with different sizes")
        return known

    def rebuild_tensor(self, storage, offset, size, stride, *rest):
        if not isinstance(storage, _Storage):
            self.refuse("a tensor without a storage")
        ints = (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)
                and len(size) == len(stride) and all(isinstance(n, int) for n in size + stride))
        if not ints or offset < 0 or any(n < 0 for n in size + stride):
            self.refuse(f"a tensor of storage {storage.key} has an invalid size, stride or offset")
        numel = math.prod(size)
        if numel:
            extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
            if extent > storage.numel or numel > storage.numel:
                self.refuse(f"a tensor declares size {list(size)[:8]} (stride {list(stride)[:8]}) on storage "
                            f"{storage.key} of {storage.numel} elements: it does not fit (a memory bomb?)")
        self.view_bytes += numel * torch.empty((), dtype=storage.dtype).element_size()
        return _Placeholder()


def _scan_pickle(archive, prefix, path):
    records = {info.filename: info for info in archive.infolist()}
    scanner = _ScanningUnpickler(archive.read(prefix + "data.pkl"), path, records, prefix)
    try:
        scanner.load()
    except CheckpointError:
        raise
    except Exception as err:  # a malformed pickle fails in many ways; all mean "not loadable"
        raise CheckpointError(f"cannot read checkpoint {path}: malformed data.pkl ({type(err).__name__})") from None
    stored = sum(s.numel * torch.empty((), dtype=s.dtype).element_size() for s in scanner.storages.values())
    _check_view_bytes(scanner.view_bytes, stored, path)
    return stored


def _check_view_bytes(view_bytes, stored, path):
    if view_bytes > MAX_VIEW_BYTES_PER_STORED_BYTE * stored + (1 << 20):
        raise CheckpointError(
            f"refusing to load checkpoint {path}: its tensors view {view_bytes} bytes of {stored} stored "
            "bytes (the same data referenced over and over: a memory bomb?)")


def _referenced_tensor_bytes(state, path):
    """Bytes of all tensors in ``state``, counting every reference (pickle's memo lets one
    tensor appear under many names, and each name is copied when averaging)."""
    total, stack, seen = 0, [state], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 10 * MAX_CONFIG_NODES:
            raise CheckpointError(f"refusing to load checkpoint {path}: more than {10 * MAX_CONFIG_NODES} objects")
        if isinstance(node, torch.Tensor):
            total += node.numel() * node.element_size()
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return total


# --- 3./4. load from memory, check fairseq's layout -----------------------------------------------


def _check_plain_config(config, where, path, leaves_checked=True):
    """Config values are plain data: no tensors, no objects, no omegaconf interpolations
    (``leaves_checked=False``, for extra_state: only its size and depth are bounded)."""
    stack, seen = [(config, where, 0)], 0
    while stack:
        node, at, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES:
            raise CheckpointError(f"checkpoint {path} is malformed: {where} has more than {MAX_CONFIG_NODES} values")
        if depth > MAX_CONFIG_DEPTH:
            raise CheckpointError(f"checkpoint {path} is malformed: {where} is nested more than "
                                  f"{MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, argparse.Namespace):
            node = vars(node)
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, (str, int)):
                    raise CheckpointError(f"checkpoint {path} is malformed: {at} has a key of type {type(key).__name__}")
                stack.append((value, f"{at}.{key}", depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((value, f"{at}[{i}]", depth + 1) for i, value in enumerate(node))
        elif not leaves_checked:
            continue
        elif isinstance(node, str):
            if "${" in node:
                raise CheckpointError(f"refusing to load checkpoint {path}: {at} is an omegaconf interpolation "
                                      f"({node[:60]!r}); fairseq saves resolved values")
        elif node is not None and not isinstance(node, (bool, int, float)):
            raise CheckpointError(f"checkpoint {path} is malformed: {at} is a {type(node).__name__}, "
                                  "not a config value")


def check_fairseq_layout(state, path) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has the layout of a fairseq checkpoint."""
    malformed = f"checkpoint {path} is not a fairseq checkpoint"
    if not isinstance(state, dict):
        raise CheckpointError(f"{malformed}: it holds a {type(state).__name__}, not a dict")
    unexpected = sorted(str(key)[:40] for key in state if key not in FAIRSEQ_ENTRIES)
    if unexpected:
        raise CheckpointError(f"{malformed}: unexpected entries {', '.join(unexpected[:5])}")
    model = state.get("model")
    if model is None:
        raise CheckpointError(f"{malformed}: no 'model' entry")
    if not isinstance(model, dict) or not model:
        what = "an empty dict" if isinstance(model, dict) else f"a {type(model).__name__}"
        raise CheckpointError(f"{malformed}: 'model' is {what}, not a dict of tensors")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        raise CheckpointError(f"{malformed}: 'model' holds something other than named tensors")
    args, cfg = state.get("args"), state.get("cfg")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise CheckpointError(f"{malformed}: 'args' is a {type(args).__name__}, not an argparse.Namespace")
    if cfg is not None and not isinstance(cfg, dict):
        raise CheckpointError(f"{malformed}: 'cfg' is a {type(cfg).__name__}, not a dict")
    if args is None and cfg is None:
        raise CheckpointError(f"{malformed}: neither 'args' nor 'cfg' (the training config)")
    config = args if args is not None else cfg
    if args is None:
        for section, value in cfg.items():
            if value is not None and not isinstance(value, (dict, argparse.Namespace)) and section != "_name":
                raise CheckpointError(f"{malformed}: cfg.{section} is a {type(value).__name__}")
        if not isinstance(cfg.get("model"), (dict, argparse.Namespace)):
            raise CheckpointError(f"{malformed}: no cfg.model (the model's config)")
    elif not isinstance(getattr(args, "arch", None), str) or not isinstance(getattr(args, "task", None), str):
        raise CheckpointError(f"{malformed}: 'args' names no arch and task")
    history = state.get("optimizer_history")
    if history is None and not {"optimizer", "best_loss"} <= state.keys():
        raise CheckpointError(f"{malformed}: no 'optimizer_history'")
    if history is not None and not (isinstance(history, list) and history
                                    and all(isinstance(h, dict) for h in history)):
        raise CheckpointError(f"{malformed}: 'optimizer_history' is not a list of dicts")
    for name, value in (("args", args), ("cfg", cfg)):
        if value is not None:
            _check_plain_config(value, name, path)
    if state.get("extra_state") is not None:  # (holds tensors: fairseq's metrics)
        _check_plain_config(state["extra_state"], "extra_state", path, leaves_checked=False)
    check_named_files(state, path)
    # Translation models and language models always store their token embeddings; without them
    # the config's sizes could not be checked against the weights (check_config_fits_weights),
    # and fairseq would build whatever the config asks (an FFN of 10^8 units) before comparing.
    task, _, _ = checkpoint_task(state)
    if task in ("translation", "language_modeling") and "fsdp_metadata" not in state \
            and not isinstance(model.get("decoder.embed_tokens.weight"), torch.Tensor):
        raise CheckpointError(f"{malformed}: it holds no decoder.embed_tokens.weight (a translation or language "
                              "model always stores its token embeddings)")
    try:
        check_config_strings(config, "args" if args is not None else "cfg")
    except CodeInConfigError as err:
        raise CheckpointError(f"refusing to load checkpoint {path}: {err}") from None
    arch = checkpoint_architecture(state)
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch is not None and not isinstance(arch, str):
        raise CheckpointError(f"{malformed}: its architecture is a {type(arch).__name__}")
    if arch is not None and arch not in ARCH_MODEL_REGISTRY:
        # fairseq itself dies here with "IndexError: Replacement index 1 out of range".
        raise CheckpointError(
            f"checkpoint {path} was trained with architecture {arch!r}, which is not registered: "
            "load the plugin that defines it (fairseq: --user-dir)"
        )


def checkpoint_architecture(state):
    """The ``--arch`` (or hydra ``model._name``) of a loaded checkpoint state."""
    if state.get("args") is not None:
        return getattr(state["args"], "arch", None)
    model_cfg = (state.get("cfg") or {}).get("model")
    return config_option(model_cfg, "_name") or config_option(model_cfg, "arch")


def checkpoint_task(state):
    """(task name, source language, target language) stored in a verified checkpoint
    state; each None when not stored as a string."""
    args = state.get("args")
    name = config_option(args, "task") if args is not None else (
        checkpoint_task_option(state, "_name") or checkpoint_task_option(state, "task"))
    return (name if isinstance(name, str) else None, checkpoint_task_option(state, "source_lang"),
            checkpoint_task_option(state, "target_lang"))


def checkpoint_task_option(state, key):
    """A task option (``data``, ``source_lang``...) stored in a verified checkpoint state
    (its ``args``, else its ``cfg.task``); None unless it is a string."""
    args = state.get("args")
    value = config_option(args if args is not None else (state.get("cfg") or {}).get("task"), key)
    return value if isinstance(value, str) else None


def read_checkpoint(path) -> dict:
    """The state of a checkpoint file, as ``torch.load`` returns it, after every check above.

    The file is read once; what is unpickled is exactly what was checked.
    """
    return _read_verified(path)[1]


def _read_verified(path):
    """(the file's bytes, its verified state)."""
    data = read_file_once(path)
    archive, prefix = _open_torch_zip(data, path)
    stored = _scan_pickle(archive, prefix, path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch's errors for bad files are many; each means "not loadable"
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise CheckpointError(f"cannot read checkpoint {path}: {lines[-1] if lines else type(err).__name__}") from None
    _check_view_bytes(_referenced_tensor_bytes(state, path), stored, path)
    check_fairseq_layout(state, path)
    return data, state


def verify_checkpoint_file(path) -> Path:
    """Raise a one-line :class:`CheckpointError` unless ``path`` is a loadable, safe checkpoint.

    For a quick check only: a tool that loads the file uses :func:`read_checkpoint`
    (or fairseq's loader, guarded) so that what it loads is what was checked.
    """
    read_checkpoint(path)
    return Path(path)


# --- the guard: fairseq's own loader ----------------------------------------------------------


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` through :func:`read_checkpoint`.

    The tail is fairseq 0.12.3's own (overrides, omegaconf config, upgrade of old
    formats); only the opening of the file differs.
    """
    from fairseq.file_io import PathManager

    return prepare_for_fairseq(read_checkpoint(PathManager.get_local_path(path)), path, arg_overrides)


def prepare_for_fairseq(state, path, arg_overrides=None):
    """A :func:`read_checkpoint` state in the form fairseq's loader returns (what
    ``load_model_ensemble_and_task(state=...)`` expects)."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    close_fairseq_eval_calls()  # modules imported since the plugin (e.g. another --user-dir)
    _forget_initialisation_files(state)
    if state.get("args") is not None and arg_overrides is not None:
        for arg_name, arg_val in arg_overrides.items():
            setattr(state["args"], arg_name, arg_val)
    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        if arg_overrides is not None:
            checkpoint_utils.overwrite_args_by_name(state["cfg"], arg_overrides)
    try:
        state = checkpoint_utils._upgrade_state_dict(state)
    except (KeyError, AttributeError, TypeError, ValueError, IndexError) as err:
        raise CheckpointError(f"checkpoint {path} is malformed: fairseq cannot upgrade it "
                              f"({type(err).__name__}: {str(err)[:80]})") from None
    check_config_fits_weights(state, path)
    return state


# --- the config must fit the weights ----------------------------------------------------------

# Options a model reads only to initialise weights from a file, weights that a loaded
# checkpoint then replaces: a checkpoint never needs those files (and must not make a
# loader open a path it names, /dev/zero included). Each is set to what it means at
# load: no file, or for Admin's profile WEIGHTS_FROM_CHECKPOINT, which tells the model
# that its omegas are the checkpoint's (so it does not warn that they start at 1).
WEIGHTS_FROM_CHECKPOINT = "<weights from the checkpoint>"
INITIALISATION_FILE_OPTIONS = {"admin_profile": WEIGHTS_FROM_CHECKPOINT, "encoder_embed_path": None,
                               "decoder_embed_path": None}
# A model may hold a little more than its stored weights (sinusoidal position tables,
# buffers), never many times more.
MAX_BUILT_PER_STORED_ELEMENT = 2
MAX_CHECKED_LAYERS = 1000  # deeper than any model this project (or fairseq's examples) builds
BUILT_ELEMENTS_SLACK = 1 << 24


def config_option(config, name):
    """An option of a fairseq config: an argparse Namespace, a dict or an omegaconf config
    (as stored in checkpoints, or built in memory); None when absent or not a config."""
    try:
        if isinstance(config, dict) or OmegaConf.is_config(config):
            return config.get(name)
    except Exception:  # noqa: BLE001  (omegaconf's struct errors: the option is absent)
        return None
    return getattr(config, name, None) if isinstance(config, argparse.Namespace) else None


def set_config_option(config, name, value):
    if OmegaConf.is_config(config):
        with open_dict(config):
            config[name] = value
    elif isinstance(config, dict):
        config[name] = value
    else:
        setattr(config, name, value)


def drop_config_option(config, name):
    if isinstance(config, argparse.Namespace):
        config.__dict__.pop(name, None)
    else:
        config.pop(name, None)


def _has_option(config, name) -> bool:
    if isinstance(config, argparse.Namespace):
        return hasattr(config, name)
    return (isinstance(config, dict) or OmegaConf.is_config(config)) and name in config


def _forget_initialisation_files(state):
    """Replace the :data:`INITIALISATION_FILE_OPTIONS` of a checkpoint's model config
    (flat, or nested as ``encoder.embed_path``), before the caller's overrides."""
    # --replace-unk PATH (an alignment dictionary) is a decoding choice of whoever decodes, not
    # of the checkpoint: a stored path (fairseq opens and parses it unchecked) is dropped.
    for config in (state.get("args"), config_option(state.get("cfg"), "generation")):
        if isinstance(config_option(config, "replace_unk"), str):
            set_config_option(config, "replace_unk", None)
    model_configs = [state.get("args"), config_option(state.get("cfg"), "model")]
    for config in model_configs:
        for name, at_load in INITIALISATION_FILE_OPTIONS.items():
            if _has_option(config, name) and config_option(config, name) != at_load:
                set_config_option(config, name, at_load)
        for stack in ("encoder", "decoder"):
            nested = config_option(config, stack)
            if isinstance(nested, (dict, argparse.Namespace)) and config_option(nested, "embed_path") is not None:
                set_config_option(nested, "embed_path", None)


# Options of fairseq's subword encoders (--bpe) that name a file or URL to open. A checkpoint
# may name a file (fairseq-train stores the path it was given), but not a pipe or device,
# which would block or never end, nor a URL to download other than fairseq's own defaults.
ENCODER_FILE_OPTIONS = ("sentencepiece_model", "sentencepiece_model_path", "bpe_codes", "gpt2_encoder_json",
                        "gpt2_vocab_bpe", "bpe_vocab_file", "bpe_merges", "bpe_vocab")
FAIRSEQ_DEFAULT_URLS = {"https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json",
                        "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/vocab.bpe"}


def check_named_files(state, path) -> None:
    """Refuse a checkpoint whose subword-encoder options name a URL or a file that is not a
    regular file (see :data:`ENCODER_FILE_OPTIONS`)."""
    cfg = state.get("cfg") if isinstance(state.get("cfg"), dict) else {}
    sources = [("args", state.get("args"))] + [(f"cfg.{section}", cfg.get(section)) for section in ("bpe", "tokenizer")]
    for where, config in sources:
        for name in ENCODER_FILE_OPTIONS:
            value = config_option(config, name)
            if not isinstance(value, str) or value in ("", "???") or value in FAIRSEQ_DEFAULT_URLS:
                continue
            if "://" in value:
                raise CheckpointError(f"refusing to load checkpoint {path}: {where}.{name} names a URL "
                                      f"({value[:60]!r}), which loading it would download")
            try:
                mode = os.stat(value).st_mode
            except (OSError, ValueError):
                continue  # no such file here: fairseq says so if it needs it (the hub uses its own copy)
            if not stat.S_ISREG(mode):
                raise CheckpointError(f"refusing to load checkpoint {path}: {where}.{name} names {value[:60]!r}, "
                                      "which is not a regular file")


class SizedDictionary:
    """Stands in for a fairseq Dictionary where only its size and padding index matter."""

    def __init__(self, size, pad=1):
        self.size, self.pad_index = size, pad

    def __len__(self):
        return self.size

    def pad(self):
        return self.pad_index


def _stored_layers(weights, stack) -> int:
    prefix = f"{stack}.layers."
    return len({name[len(prefix):].split(".", 1)[0] for name in weights if name.startswith(prefix)})


def check_layer_counts(model_cfg, weights, path) -> None:
    """Refuse a config asking for more encoder/decoder layers than the weights hold
    (building even empty layers costs time and memory per layer)."""
    for stack in ("encoder", "decoder"):
        asked = config_option(model_cfg, f"{stack}_layers")
        if asked is None:
            asked = config_option(config_option(model_cfg, stack), "layers")
        if not isinstance(asked, int) or isinstance(asked, bool):
            continue  # other models spell layers otherwise (fconv: a string); fairseq checks those
        stored = _stored_layers(weights, stack)
        # No "{stack}.layers.N" weights: a model that names its layers otherwise (fairseq's
        # lstm: encoder.lstm.weight_ih_l0); the meta build's element count bounds it, and
        # MAX_CHECKED_LAYERS bounds the build itself.
        if (stored and asked > stored) or asked > MAX_CHECKED_LAYERS:
            raise CheckpointError(f"checkpoint {path} is malformed: its config asks for {asked} "
                                  f"{stack} layers, its weights hold {stored}")


# Building on the meta device would initialise every weight and compute the sinusoidal
# position tables there, which torch does through its Python decompositions: the first
# such op imports torch._dynamo, 2-3 s per process (every fairseq-generate, resume,
# translate). The shapes need neither, so while *this thread* builds shapes, the public
# torch.nn.init functions and fairseq's sinusoidal table return their tensor untouched /
# empty. The wrappers are installed on the first check and do exactly what the originals
# do for every other caller and thread.
_building_shapes = threading.local()


def _unless_building_shapes(function, shapes_only):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if getattr(_building_shapes, "active", False):
            return shapes_only(*args, **kwargs)
        return function(*args, **kwargs)

    wrapper.residual_fairseq_shapes_only = True
    return wrapper


def _install_shape_only_paths() -> None:
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

    for name in dir(torch.nn.init):
        function = getattr(torch.nn.init, name)
        if name.endswith("_") and not name.startswith("_") and callable(function) \
                and not getattr(function, "residual_fairseq_shapes_only", False):
            setattr(torch.nn.init, name, _unless_building_shapes(function, lambda tensor, *a, **k: tensor))
    table = SinusoidalPositionalEmbedding.get_embedding
    if not getattr(table, "residual_fairseq_shapes_only", False):
        SinusoidalPositionalEmbedding.get_embedding = staticmethod(_unless_building_shapes(
            table, lambda num_embeddings, embedding_dim, *a, **k: torch.empty(num_embeddings, embedding_dim)))


@contextlib.contextmanager
def _shapes_only():
    _install_shape_only_paths()
    _building_shapes.active = True
    try:
        with torch.device("meta"):
            yield
    finally:
        _building_shapes.active = False


def config_shapes(model_cfg, weights, path):
    """{name: shape} of the state of the model ``model_cfg`` describes, and the number
    of elements of all its tensors (parameters, buffers, tables such as the sinusoidal
    positions), built on the meta device: nothing is allocated. The dictionaries are
    sized from the stored embeddings. None when there are none to size them from.

    Raises :class:`CheckpointError` for too many layers (:func:`check_layer_counts`);
    fairseq's own errors while building pass through.
    """
    from fairseq import models

    check_layer_counts(model_cfg, weights, path)
    sizes = {stack: weights.get(f"{stack}.embed_tokens.weight") for stack in ("encoder", "decoder")}
    if not (isinstance(sizes["decoder"], torch.Tensor) and sizes["decoder"].dim() == 2):
        return None
    target = SizedDictionary(sizes["decoder"].shape[0])
    source = target
    if isinstance(sizes["encoder"], torch.Tensor) and sizes["encoder"].dim() == 2 \
            and sizes["encoder"].shape[0] != len(target):
        source = SizedDictionary(sizes["encoder"].shape[0])
    # One object for both sides when they match: --share-all-embeddings asks for a joined dictionary.
    task = SimpleNamespace(source_dictionary=source, target_dictionary=target,
                           dictionary=target, output_dictionary=target)
    config = argparse.Namespace(**vars(model_cfg)) if isinstance(model_cfg, argparse.Namespace) \
        else copy.deepcopy(model_cfg)  # builders fill in defaults: never in the caller's config
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the real build says it all again
    try:
        with _shapes_only():
            model = models.build_model(config, task)
    finally:
        logging.disable(previous)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    elements = 0
    for module in model.modules():
        tensors = {id(t): t for t in (*module.parameters(recurse=False), *module.buffers(recurse=False),
                                      *(v for v in vars(module).values() if isinstance(v, torch.Tensor)))}
        elements += sum(t.numel() for t in tensors.values())
    return shapes, elements


def check_config_fits_weights(state, path) -> None:
    """Raise :class:`CheckpointError` unless the model that fairseq will build from the
    (upgraded) state's config has the stored shapes and not many more elements."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    weights = state["model"]
    if "fsdp_metadata" in state:
        return  # sharded: each file holds part of the weights
    cfg = convert_namespace_to_omegaconf(state["args"]) if state.get("args") is not None else state["cfg"]
    try:
        built = config_shapes(cfg.model, weights, path)
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001  the real build will fail the same way and say so
        return
    if built is None:
        return
    shapes, elements = built
    wrong = [name for name in shapes if name in weights and tuple(weights[name].shape) != shapes[name]]
    if wrong:
        name = wrong[0]
        raise CheckpointError(f"checkpoint {path} is malformed: its config makes {name} "
                              f"{list(shapes[name])}, its weights hold {list(weights[name].shape)}")
    stored = sum(tensor.numel() for tensor in weights.values())
    if elements > MAX_BUILT_PER_STORED_ELEMENT * stored + BUILT_ELEMENTS_SLACK:
        raise CheckpointError(f"refusing to load checkpoint {path}: its config asks for a model of "
                              f"{elements:,} values, its weights hold {stored:,}")


_fairseq_load_checkpoint_to_cpu = None


def install_loading_guard() -> None:
    """Make fairseq open checkpoint files with :func:`load_checkpoint_to_cpu`, in
    ``fairseq.checkpoint_utils`` and in every fairseq module that imported it by name."""
    global _fairseq_load_checkpoint_to_cpu
    import sys

    from fairseq import checkpoint_utils

    if _fairseq_load_checkpoint_to_cpu is None:
        _fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("fairseq", "fairseq_cli") and \
                getattr(module, "load_checkpoint_to_cpu", None) is _fairseq_load_checkpoint_to_cpu:
            module.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    from fairseq import file_utils

    file_utils.load_archive_file = load_archive_file  # (hub_utils looks it up on the module per call)


def load_archive_file(archive_file):
    """fairseq's ``file_utils.load_archive_file`` (``from_pretrained`` of a model archive), made safe:
    fairseq extracts every member unfiltered (``../`` escapes the temp dir) and then deletes the
    archive, replacing it by the extracted directory. Here members go through the data filter of
    :func:`residual_fairseq.data.download.extract_archive`, into a temp dir removed at exit, and the
    archive is left as it was."""
    import atexit
    import shutil
    import tempfile

    from fairseq import file_utils

    from .data.download import extract_archive

    try:
        resolved = file_utils.cached_path(archive_file, cache_dir=None)  # (downloads a URL to fairseq's cache)
    except EnvironmentError:
        return None  # as fairseq: the caller reports the name it could not find
    if os.path.isdir(resolved):
        return resolved
    into = tempfile.mkdtemp(prefix="residual-fairseq-archive-")
    atexit.register(shutil.rmtree, into, True)
    extract_archive(resolved, into)
    top = os.path.commonpath([str(path) for path in Path(into).iterdir()] or [into])
    return top if os.path.isdir(top) else into


# --- building models from a verified state ----------------------------------------------------


class WeightsMismatchError(CheckpointError):
    """The checkpoint's weights do not fit the model built for it (typically other dictionaries)."""

    def __init__(self, path, detail):
        self.detail = detail
        super().__init__(f"checkpoint {path} does not fit the dictionaries: {detail}")


def load_models(path, task=None, arg_overrides=None, state=None):
    """(models, cfg, task) of one checkpoint file, opened once through :func:`read_checkpoint`
    (or from ``state``, what :func:`read_checkpoint` returned for ``path``).

    The path is never split on ``:`` (fairseq's ensemble syntax). Failures while
    fairseq builds the model from the checkpoint's config are one-line
    :class:`CheckpointError` s; a shape mismatch is a :class:`WeightsMismatchError`.
    """
    from fairseq import checkpoint_utils

    state = read_checkpoint(path) if state is None else state
    state = prepare_for_fairseq(state, path, arg_overrides)
    try:
        return checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=arg_overrides,
                                                             task=task, state=state)
    except UserError:
        raise
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        mismatch = [line for line in lines if "size mismatch" in line]
        if mismatch:
            raise WeightsMismatchError(path, mismatch[0]) from None
        detail = " ".join(lines[:2])[:200] if lines else type(err).__name__
        raise CheckpointError(f"checkpoint {path}: its weights do not fit its model: {detail}") from None
    except Exception as err:  # a verified but nonsensical config fails anywhere in fairseq's builders
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise CheckpointError(f"checkpoint {path}: fairseq cannot build a model from its config "
                              f"({type(err).__name__}: {first})") from None


# --- resume -----------------------------------------------------------------------------------


def run_checkpoints(save_dir):
    """The checkpoints fairseq wrote for a run in ``save_dir`` (never averaged or other files)."""
    return [p for p in Path(save_dir).iterdir() if RUN_CHECKPOINT.fullmatch(p.name) and p.is_file()]


def repair_last_checkpoint(save_dir):
    """Make ``checkpoint_last.pt`` in ``save_dir`` loadable again after a crash.

    fairseq writes its first checkpoint file atomically (temp file + rename) but
    *copies* it to ``checkpoint_last.pt`` in place, so a kill during that copy
    leaves a truncated ``checkpoint_last.pt``. If that happened, replace it
    (atomically, with the verified bytes) by the newest valid checkpoint fairseq
    wrote for the run (``checkpointN.pt``, ``checkpoint_E_U.pt``, ``checkpoint_best.pt``;
    never ``checkpoint.avg*.pt`` or any other file), and return that file's path;
    return None when nothing needed repair.
    """
    save_dir = Path(save_dir)
    last = save_dir / "checkpoint_last.pt"
    if not last.exists() or is_intact(last) or read_file_once(last)[:4] != b"PK\x03\x04":
        return None  # intact, or not a cut-off zip at all (that is no crash of fairseq's: an error on load)
    candidates = sorted((p for p in run_checkpoints(save_dir) if p != last), key=lambda p: p.stat().st_mtime,
                        reverse=True)
    for candidate in candidates:
        try:
            data, _state = _read_verified(candidate)
        except UserError:  # an unusable candidate is skipped
            continue
        with atomic_output(last) as staging:
            Path(staging).write_bytes(data)
        return candidate
    raise CheckpointError(
        f"{last} is truncated and {save_dir} holds no intact checkpoint of the run to resume from; "
        "move it away to start training from scratch"
    )
