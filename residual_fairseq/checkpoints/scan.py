"""A dry unpickling of a checkpoint's ``data.pkl`` that builds nothing (check 2).

Every global must be one a fairseq checkpoint holds (tensors, ``OrderedDict``,
``argparse.Namespace``, numpy's int64 metrics), every storage key is a plain name
whose record holds exactly the declared number of bytes, and every tensor fits inside
its storage (no stride-0 views declaring terabytes), with all tensors together at most
:data:`MAX_VIEW_BYTES_PER_STORED_BYTE` times the stored bytes. The same globals are
what ``torch.load(weights_only=True)`` is allowed (:func:`fairseq_checkpoint_globals`).
"""
import argparse
import collections
import io
import math
import pickle
import re
import warnings

import numpy as np
import torch

from .errors import CheckpointError

# Tensors may view the same storage (tied embeddings: 3 views of one table), but not
# so often that copying them (averaging does) needs far more memory than the file.
MAX_VIEW_BYTES_PER_STORED_BYTE = 8
MAX_REFERENCED_OBJECTS = 1_000_000  # objects in a checkpoint: far more than fairseq ever stores
_STORAGE_KEY = re.compile(r"[A-Za-z0-9_]+")


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


def scan_pickle(archive, prefix, path):
    records = {info.filename: info for info in archive.infolist()}
    scanner = _ScanningUnpickler(archive.read(prefix + "data.pkl"), path, records, prefix)
    try:
        scanner.load()
    except CheckpointError:
        raise
    except Exception as err:  # a malformed pickle fails in many ways; all mean "not loadable"
        raise CheckpointError(f"cannot read checkpoint {path}: malformed data.pkl ({type(err).__name__})") from None
    stored = sum(s.numel * torch.empty((), dtype=s.dtype).element_size() for s in scanner.storages.values())
    check_view_bytes(scanner.view_bytes, stored, path)
    return stored


def check_view_bytes(view_bytes, stored, path):
    if view_bytes > MAX_VIEW_BYTES_PER_STORED_BYTE * stored + (1 << 20):
        raise CheckpointError(
            f"refusing to load checkpoint {path}: its tensors view {view_bytes} bytes of {stored} stored "
            "bytes (the same data referenced over and over: a memory bomb?)")


def referenced_tensor_bytes(state, path):
    """Bytes of all tensors in ``state``, counting every reference (pickle's memo lets one
    tensor appear under many names, and each name is copied when averaging)."""
    total, stack, seen = 0, [state], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_REFERENCED_OBJECTS:
            raise CheckpointError(f"refusing to load checkpoint {path}: more than {MAX_REFERENCED_OBJECTS} objects")
        if isinstance(node, torch.Tensor):
            total += node.numel() * node.element_size()
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return total

