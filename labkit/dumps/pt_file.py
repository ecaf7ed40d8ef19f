"""Read a PyTorch `.pt` file without torch and without running any pickled code.

A `.pt` file (torch.save's zip format) is `<archive>/data.pkl`, a pickle describing the
objects, and `<archive>/data/<key>`, the raw bytes of each tensor storage. Unpickling runs
whatever callables the pickle names, so a hostile file can execute code; `torch.load`
guards against that with `weights_only=True`, an allowlist of globals. This reader does
the same with its own stand-ins: the pickle may name only the tensor rebuild functions,
storage types, dtypes, `torch.Size` and `collections.OrderedDict`, each mapped to a small
function here that builds numpy arrays. Any other global is an `UnsafePickleError` naming
it, raised before anything the pickle names is called; a persistent id other than a
storage reference is refused the same way.

Tensors come back as `PtTensor` (a numpy array and the dtype torch stored: bf16 values are
widened exactly to float32, with "bfloat16" kept, so the run's precision stays bf16).
"""

from __future__ import annotations

import _compat_pickle
import collections
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import DumpsFileError


class UnsafePickleError(DumpsFileError):
    """A .pt file whose pickle would import or call something that is not a tensor part."""


@dataclass(frozen=True)
class PtTensor:
    """One tensor of a .pt file: its values and the dtype torch stored it in."""

    array: np.ndarray
    stored: str


@dataclass(frozen=True)
class _StorageType:
    dtype: str  # torch's name: "float32", "bfloat16", ...


# torch storage class → (dtype name, numpy dtype of the raw bytes)
_STORAGES = {
    "FloatStorage": ("float32", "<f4"),
    "DoubleStorage": ("float64", "<f8"),
    "HalfStorage": ("float16", "<f2"),
    "BFloat16Storage": ("bfloat16", "<u2"),
    "LongStorage": ("int64", "<i8"),
    "IntStorage": ("int32", "<i4"),
    "ShortStorage": ("int16", "<i2"),
    "CharStorage": ("int8", "i1"),
    "ByteStorage": ("uint8", "u1"),
    "BoolStorage": ("bool", "?"),
}
_RAW = dict(_STORAGES.values())
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


def _rebuild_tensor(storage: np.ndarray, offset: int, size, stride, *rest) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2: a strided view of the storage, copied; checked to stay inside it."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise DumpsFileError(f"a tensor with offset {offset}, size {size}, stride {stride}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= storage.size:
        raise DumpsFileError(f"a tensor of size {size} reaches element {last} of a storage of {storage.size}")
    flat = np.asarray(storage)[offset:]
    view = np.lib.stride_tricks.as_strided(
        flat, shape=size, strides=[s * flat.itemsize for s in stride], writeable=False
    )
    return _Typed(np.array(view), getattr(storage, "torch_dtype", flat.dtype.name))


def _rebuild_parameter(data, requires_grad=False, hooks=None, *rest):
    return data


def _size(dims=()) -> tuple[int, ...]:
    return tuple(int(d) for d in dims)


def _ordered_dict(items=()) -> collections.OrderedDict:
    return collections.OrderedDict(items)


_CALLABLES = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch.Size": _size,
    "collections.OrderedDict": _ordered_dict,
}


class _Unpickler(pickle.Unpickler):
    """pickle.Unpickler whose globals and persistent ids are the allowlist above, nothing else."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, path: Path):
        super().__init__(file)
        self.archive, self.prefix, self.path = archive, prefix, path
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:  # protocol 2 writes Python 2 names
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        key = f"{module}.{name}"
        if key in _CALLABLES:
            return _CALLABLES[key]
        if module == "torch" and name in _STORAGES:
            return _StorageType(_STORAGES[name][0])
        if module == "torch" and name in _DTYPES:
            return name
        raise UnsafePickleError(
            f"{self.path}: its pickle asks for {key}, which is not part of a tensor; refused before "
            "anything in it ran (labkit reads tensors, dicts, lists and numbers only)"
        )

    def persistent_load(self, pid: Any) -> np.ndarray:
        ok = isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
        if not ok:
            raise UnsafePickleError(f"{self.path}: a persistent id {str(pid)[:80]!r} that is no tensor storage")
        key = str(pid[2])
        if key not in self.storages:
            try:
                raw = self.archive.read(f"{self.prefix}data/{key}")
            except KeyError:
                raise DumpsFileError(f"{self.path}: storage {key!r} is missing from the archive") from None
            self.storages[key] = np.frombuffer(raw, dtype=_RAW[pid[1].dtype])
        return _Typed(self.storages[key], pid[1].dtype)


class _Typed(np.ndarray):
    """A storage's elements that remember torch's dtype name (bf16 is raw uint16 until widened)."""

    def __new__(cls, a: np.ndarray, dtype: str):
        obj = np.asarray(a).view(cls)
        obj.torch_dtype = dtype
        return obj

    def __array_finalize__(self, obj):
        self.torch_dtype = getattr(obj, "torch_dtype", None)


def read_pt(path: str | Path) -> Any:
    """The object a .pt file holds, with every tensor as a PtTensor."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise DumpsFileError(f"{path}: not a torch.save zip archive ({e}); legacy .pt files are not read") from None
    with archive:
        pkl = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pkl) != 1:
            raise DumpsFileError(f"{path}: expected one data.pkl in the archive, found {len(pkl)}")
        prefix = pkl[0][: -len("data.pkl")]
        with archive.open(pkl[0]) as fh:
            try:
                obj = _Unpickler(fh, archive, prefix, path).load()
            except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError) as e:
                raise DumpsFileError(f"{path}: unreadable pickle: {e}") from None
    return _wrap(obj)


def _wrap(obj: Any) -> Any:
    """Tensors (arrays rebuilt from storages) → PtTensor, bf16 widened; containers walked."""
    if isinstance(obj, np.ndarray):
        dtype = getattr(obj, "torch_dtype", None) or obj.dtype.name
        a = np.asarray(obj)
        if dtype == "bfloat16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return PtTensor(np.array(a), dtype)
    if isinstance(obj, dict):
        return {k: _wrap(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_wrap(v) for v in obj)
    return obj
