"""Read another engine's dumped tensors: a directory of .npy or .pt files, an .npz, a .pt, a
.safetensors file or a dict of arrays, into {name: numpy array} with the dtypes as stored.
.pt files are read without torch and without running their pickles (labkit.dumps.pt_file);
their integer tensors (an engine's token ids and positions) are kept apart in `Source.ids`.

bf16 has no numpy dtype, so the safetensors library's numpy reader refuses it; those tensors
are read from the file's own header and bytes (a bf16 value is the top half of an f32) and
come back as float32 with their stored dtype recorded, so the run's precision stays bf16.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from labkit.dumps.steps import files_of_step, rank0_folder
from labkit.errors import DumpsFileError


@dataclass(frozen=True)
class Dumped:
    """One foreign tensor: its values (never a bf16 view), and the dtype it was stored in."""

    name: str
    array: np.ndarray
    stored: str  # "float16", "bfloat16", "float32", "float64", ...


def read_source(
    source: Any, integers: dict[str, np.ndarray] | None = None, step: int | None = None
) -> dict[str, Dumped]:
    """{name: Dumped} from a path (directory of .npy or .pt, .npz, .npy, .pt, .safetensors) or a dict
    of arrays. Integer tensors of .pt files go into `integers` when given (else they are dropped).
    step: which forward pass of a folder that holds several (labkit.dumps.steps); default the first."""
    if isinstance(source, dict):
        return {str(k): _dumped(str(k), v) for k, v in source.items()}
    path = Path(source)
    if not path.exists():
        raise DumpsFileError(f"{path}: no such file or directory")
    integers = {} if integers is None else integers
    try:
        path = rank0_folder(path)
        if path.is_dir() and any(path.glob("*.pt")):
            return read_pt_files(files_of_step(sorted(path.glob("*.pt")), step), integers)
        if path.suffix == ".pt":
            return read_pt_files([path], integers)
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
    raise DumpsFileError(
        f"{path}: not a dumps source (a directory of .npy or .pt files, .npz, .npy, .pt or .safetensors)"
    )


class HeldIds(NamedTuple):
    """The token ids and first position an engine's dumps record, when they do."""

    tokens: list[int] | None
    first_position: int


# integer tensors that hold the pass's token ids or positions: SGLang's Pass files
# (model.forward_batch_info.input_ids), its dumper (input_ids), TensorRT-LLM's embedding input
_IDS = re.compile(r"(?:.*\.)?input_ids(?:\[0\])?|.*Embedding-input\.input")
_POSITIONS = re.compile(r"(?:.*\.)?positions(?:\[0\])?")


def dumped_ids(integers: dict[str, np.ndarray]) -> HeldIds:
    ids = next((a for n, a in integers.items() if _IDS.fullmatch(n)), None)
    pos = next((a for n, a in integers.items() if _POSITIONS.fullmatch(n)), None)
    tokens = None if ids is None else [int(t) for t in np.asarray(ids).reshape(-1)]
    return HeldIds(tokens, int(np.asarray(pos).reshape(-1)[0]) if pos is not None and np.size(pos) else 0)


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


def read_pt_files(paths: list[Path], integers: dict[str, np.ndarray]) -> dict[str, Dumped]:
    """Every float tensor of the .pt files by name, the integer ones into `integers`. A file holding
    {name: tensor} gives its keys (SGLang's Pass files); {"value", "meta"} gives meta["name"] (SGLang's
    dumper); a bare tensor gives the file's stem (TensorRT-LLM's per-tensor files)."""
    out: dict[str, Dumped] = {}
    for path in paths:
        for name, t in _pt_tensors(path).items():
            if t.array.dtype.kind == "f":
                out[name] = Dumped(name, t.array, t.stored)
            elif t.array.dtype.kind in "iu":
                integers[name] = t.array
    if not out:
        raise DumpsFileError(f"{paths[0]}: no float tensor in {len(paths)} .pt file(s)")
    return out


def _pt_tensors(path: Path) -> dict:
    from labkit.dumps.pt_file import PtTensor, read_pt

    obj = read_pt(path)
    if isinstance(obj, PtTensor):
        return {path.stem: obj}
    if isinstance(obj, dict) and "value" in obj and _tensors(obj["value"]):
        meta = obj.get("meta") if isinstance(obj.get("meta"), dict) else {}
        return _named(str(meta.get("name", path.stem)), obj["value"])
    if isinstance(obj, dict):
        return {n: t for k, v in obj.items() for n, t in _named(str(k), v).items()}
    if _tensors(obj):
        return _named(path.stem, obj)
    raise DumpsFileError(f"{path}: holds a {type(obj).__name__}, not tensors")


def _tensors(v: Any) -> bool:
    from labkit.dumps.pt_file import PtTensor

    return isinstance(v, PtTensor) or (isinstance(v, list | tuple) and any(isinstance(t, PtTensor) for t in v))


def _named(name: str, v: Any) -> dict:
    """A tensor under its name; a module's several outputs (SGLang keeps a tuple as a list) as
    `name[0]`, `name[1]`, ... so a preset can tell a fused norm's output from its residual."""
    from labkit.dumps.pt_file import PtTensor

    if isinstance(v, PtTensor):
        return {name: v}
    if isinstance(v, list | tuple):
        return {f"{name}[{i}]": t for i, t in enumerate(v) if isinstance(t, PtTensor)}
    return {}
