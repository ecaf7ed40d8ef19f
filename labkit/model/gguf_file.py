"""Read a GGUF file's header fast: metadata and the tensor table, memory-mapped.

`gguf.GGUFReader` builds a Python object per vocabulary entry and takes ~12 s on
Gemma's 262 144-token vocabulary. This reader walks the header once with plain
`struct` calls, keeps numeric arrays as numpy views of the map, and never reads
tensor data: tensors are byte ranges into the same `np.memmap`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.errors import ModelFileError, UnsupportedTensorTypeError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> (struct code, numpy dtype)
_SCALAR = {
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table. `shape` is numpy order: the last dim is contiguous."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def n_cols(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1


@dataclass
class GgufFile:
    """A memory-mapped GGUF file: metadata dict, tensor table, and raw tensor bytes on demand."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data_offset: int
    mmap: np.memmap = field(repr=False)

    def release(self, name: str | None = None) -> None:
        """Drop the mapped pages of one tensor (or the whole file) from this process's memory.

        The map is read-only and file-backed, so this only frees resident pages: a later read
        faults them in again from the file. Used after a tensor has been uploaded to the GPU,
        where on lavapipe it already occupies host memory once."""
        mm = getattr(self.mmap, "_mmap", None)
        if mm is None:
            return
        if name is None:
            start, length = 0, len(mm)
        else:
            t = self.tensors[name]
            start = t.offset // mmap.PAGESIZE * mmap.PAGESIZE
            length = t.offset + t.nbytes - start
        mm.madvise(mmap.MADV_DONTNEED, start, length)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the map (no copy, no read yet)."""
        t = self.tensors[name]
        return self.mmap[t.offset : t.offset + t.nbytes]


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF header (needs byte {end}, file has {len(self.buf)})")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def unpack(self, code: str) -> Any:
        return struct.unpack(code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")


def _read_value(cur: _Cursor, vtype: int) -> Any:
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype][0])
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        item_type = cur.unpack("<I")
        count = cur.unpack("<Q")
        if item_type in _SCALAR:
            dtype = np.dtype(_SCALAR[item_type][1]).newbyteorder("<")
            arr = np.frombuffer(cur.take(count * dtype.itemsize), dtype=dtype)
            return arr
        if item_type == _STRING:
            return _read_strings(cur, count)
        return [_read_value(cur, item_type) for _ in range(count)]
    raise ModelFileError(f"{cur.path}: unknown GGUF metadata value type {vtype} at byte {cur.pos}")


def _read_strings(cur: _Cursor, count: int) -> list[str]:
    """Walk `count` length-prefixed strings; one slice per string, nothing else."""
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    out = []
    unpack_from = struct.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            raise ModelFileError(f"{cur.path}: truncated GGUF header inside a string array")
        (n,) = unpack_from("<Q", buf, pos)
        pos += 8
        if pos + n > end:
            raise ModelFileError(f"{cur.path}: truncated GGUF header inside a string array")
        out.append(str(buf[pos : pos + n], "utf-8", "replace"))
        pos += n
    cur.pos = pos
    return out


def open_gguf(path: str | Path) -> GgufFile:
    """Map `path` and parse its header. Raises ModelFileError on a missing/bad/truncated file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a GGUF file")
    size = path.stat().st_size
    if size < 24:
        raise ModelFileError(f"{path}: too short to be a GGUF file ({size} bytes)")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mm), path)
    magic = bytes(cur.take(4))
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ModelFileError(f"{path}: unsupported GGUF version {version}")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I")
        metadata[key] = _read_value(cur, vtype)

    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        ne = [cur.unpack("<Q") for _ in range(n_dims)]
        ggml_type = cur.unpack("<I")
        rel_offset = cur.unpack("<Q")
        infos.append((name, ne, ggml_type, rel_offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
        raise ModelFileError(f"{path}: general.alignment is {alignment!r}, not a positive multiple of 8")
    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, ne, ggml_type, rel_offset in infos:
        if ggml_type not in GGML_QUANT_SIZES:
            raise UnsupportedTensorTypeError(f"{path}: tensor {name} has unknown ggml type {ggml_type}")
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        n_elems = int(np.prod(ne)) if ne else 1
        if ne and ne[0] % block:
            raise ModelFileError(f"{path}: tensor {name} row of {ne[0]} is not a multiple of {block}")
        nbytes = n_elems // block * type_size
        start = data_offset + rel_offset
        if start + nbytes > size:
            raise ModelFileError(
                f"{path}: truncated file: tensor {name} needs bytes up to {start + nbytes}, file has {size}"
            )
        tensors[name] = TensorInfo(name, ggml_type, tuple(reversed(ne)), start, nbytes)
    return GgufFile(path, version, metadata, tensors, data_offset, mm)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Only the metadata dict (used by tools that need the vocabulary)."""
    return open_gguf(path).metadata
