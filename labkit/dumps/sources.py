"""Read another engine's dumped tensors: a directory of .npy files, an .npz, a .safetensors
file or a dict of arrays, into {name: numpy array} with the dtypes as stored.

bf16 has no numpy dtype, so the safetensors library's numpy reader refuses it; those tensors
are read from the file's own header and bytes (a bf16 value is the top half of an f32) and
come back as float32 with their stored dtype recorded, so the run's precision stays bf16.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import DumpsFileError


@dataclass(frozen=True)
class Dumped:
    """One foreign tensor: its values (never a bf16 view), and the dtype it was stored in."""

    name: str
    array: np.ndarray
    stored: str  # "float16", "bfloat16", "float32", "float64", ...


def read_source(source: Any) -> dict[str, Dumped]:
    """{name: Dumped} from a path (directory of .npy, .npz, .npy, .safetensors) or a dict of arrays."""
    if isinstance(source, dict):
        return {str(k): _dumped(str(k), v) for k, v in source.items()}
    path = Path(source)
    if not path.exists():
        raise DumpsFileError(f"{path}: no such file or directory")
    try:
        if path.is_dir():
            return _read_dir(path)
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: _dumped(k, z[k]) for k in z.files}
        if path.suffix == ".npy":
            return {path.stem: _dumped(path.stem, np.load(path, allow_pickle=False))}
        if path.suffix == ".safetensors":
            return _read_safetensors(path)
    except DumpsFileError:
        raise
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise DumpsFileError(f"{path}: cannot read dumps: {e}") from None
    raise DumpsFileError(f"{path}: not a dumps source (a directory of .npy files, .npz, .npy or .safetensors)")


def _dumped(name: str, a: Any) -> Dumped:
    a = np.asarray(a)
    stored = a.dtype.name
    if stored == "bfloat16":  # ml_dtypes' bfloat16: widen exactly to f32
        a = a.astype(np.float32)
    elif a.dtype.kind != "f":
        raise DumpsFileError(f"dumped tensor {name!r} has dtype {a.dtype}, not a float type")
    return Dumped(name, a, stored)


def _read_dir(path: Path) -> dict[str, Dumped]:
    files = sorted(path.glob("*.npy"))
    if not files:
        raise DumpsFileError(f"{path}: a directory without .npy files")
    return {f.stem: _dumped(f.stem, np.load(f, allow_pickle=False)) for f in files}


_ST_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


def _read_safetensors(path: Path) -> dict[str, Dumped]:
    from safetensors import safe_open

    size, header = _safetensors_header(path)
    out: dict[str, Dumped] = {}
    with safe_open(str(path), framework="numpy") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] == "BF16":
                out[name] = Dumped(name, _bf16(path, 8 + size, header[name]), "bfloat16")
            elif info["dtype"] in _ST_DTYPES:
                out[name] = _dumped(name, f.get_tensor(name))
            else:
                raise DumpsFileError(f"{path}: tensor {name!r} has dtype {info['dtype']}, not a float type")
    return out


def _safetensors_header(path: Path) -> tuple[int, dict]:
    """(header length, header): the JSON after the file's first 8 bytes."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def _bf16(path: Path, data_start: int, info: dict) -> np.ndarray:
    start, end = info["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(end - start) // 2, offset=data_start + start)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
