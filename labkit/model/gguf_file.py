"""Read a GGUF file's header fast: metadata and the tensor table, memory-mapped.

`gguf.GGUFReader` builds a Python object per vocabulary entry and takes ~12 s on
Gemma's 262 144-token vocabulary. This reader walks the header once with plain
`struct` calls, keeps numeric arrays as numpy views of the map, and never reads
tensor data: tensors are byte ranges into the same `np.memmap`. Every count, length, type,
dimension and offset is checked against the file before it is used (llama.cpp's gguf.cpp rules):
nothing is allocated by an untrusted count, and nothing recurses on file data.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.errors import (
    DuplicateTensorError,
    GgufFormatError,
    MetadataKeyError,
    MetadataTypeError,
    ModelFileError,
    TensorDimensionsError,
    TensorOffsetError,
    TensorTableError,
    TruncatedFileError,
    UnknownTensorTypeError,
)

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


MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: llama.cpp refuses a tensor name of 64 bytes or more
INT64_MAX = 2**63 - 1
# the longest string array read: 64 times the largest vocabulary (262 144), so a crafted file cannot make
# tens of millions of Python strings (about 50 bytes each) out of a few bytes apiece
MAX_STRINGS = 1 << 24
# the longest key name and string value read (llama.cpp allows 1 GiB): real keys are under 100 bytes and
# the longest real value, a chat template, tens of KiB; a misread length would otherwise copy and decode
# megabytes (the fuzzer saw a 64 MiB key name reach 2.3 GB of peak RSS through backslash escapes)
MAX_KEY = 1 << 16
MAX_STRING = 1 << 24
# the smallest entry of each table: a key of one byte, its type and a one-byte value; a tensor of a
# name (even an empty one), one dimension, its type and offset. The header's counts are bounded by these.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8


class StringArray(list):
    """A GGUF array of strings as the reader gives it: its type known without looking at every item
    (a vocabulary holds 262 144 of them)."""


class _Cursor:
    """A position in the mapped file; every read is bounded by the bytes left, and says what it was
    reading (`self.what`) when the file ends first."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path, self.what = buf, 0, path, "the header"

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise TruncatedFileError(
                f"{self.path}: truncated GGUF header: {self.what} needs byte {end}, the file has {len(self.buf)}"
            )
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def unpack(self, code: str) -> Any:
        return struct.unpack(code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.take(n)  # a view: a length past the file's end is a truncated file first
        if n > MAX_STRING:
            raise GgufFormatError(
                f"{self.path}: {self.what} is a string of {n} bytes; labkit reads strings of at most {MAX_STRING}"
            )
        return str(raw, "utf-8", "replace")

    def name(self, limit: int | None = None) -> tuple[str, int]:
        """A key or tensor name and its length in bytes; invalid UTF-8 kept apart as escapes, so two
        different names never read as one. A name of `limit` bytes or more is not copied: only its
        first 80 bytes are read, for the message (a misread length can span the whole file)."""
        n = self.unpack("<Q")
        if limit is not None and n >= limit:
            return bytes(self.buf[self.pos : self.pos + 80]).decode("utf-8", errors="backslashreplace"), n
        raw = bytes(self.take(n))
        return raw.decode("utf-8", errors="backslashreplace"), len(raw)


def _read_value(cur: _Cursor, vtype: int) -> Any:
    """One metadata value; arrays of scalars are numpy views of the map, arrays of arrays refused."""
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype][0])
    if vtype == _STRING:
        return cur.string()
    if vtype != _ARRAY:
        raise GgufFormatError(f"{cur.path}: {cur.what} has GGUF value type {vtype}, which GGUF does not define")
    item_type = cur.unpack("<I")
    count = cur.unpack("<Q")
    if item_type == _STRING:
        return _read_strings(cur, count)
    if item_type not in _SCALAR:
        kind = "an array of arrays (llama.cpp's gguf.cpp refuses nested arrays)" if item_type == _ARRAY else (
            f"an array of GGUF value type {item_type}, which GGUF does not define")  # fmt: skip
        raise GgufFormatError(f"{cur.path}: {cur.what} is {kind}")
    if item_type == 7:  # bools: any nonzero byte is true, as llama.cpp reads them
        return np.frombuffer(cur.take(count), dtype=np.uint8) != 0
    dtype = np.dtype(_SCALAR[item_type][1]).newbyteorder("<")
    return np.frombuffer(cur.take(count * dtype.itemsize), dtype=dtype)


def _read_strings(cur: _Cursor, count: int) -> StringArray:
    """Walk `count` length-prefixed strings; one slice per string, nothing else."""
    if count > MAX_STRINGS:
        raise GgufFormatError(f"{cur.path}: {cur.what} claims {count} strings; labkit reads at most {MAX_STRINGS}")
    if count * 8 > cur.left():
        raise TruncatedFileError(
            f"{cur.path}: {cur.what} claims {count} strings at byte {cur.pos}, more than the "
            f"{cur.left()} bytes left can hold"
        )
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    out = StringArray()
    unpack_from = struct.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            raise TruncatedFileError(f"{cur.path}: truncated GGUF header inside {cur.what}, a string array")
        (n,) = unpack_from("<Q", buf, pos)
        pos += 8
        if pos + n > end:
            raise TruncatedFileError(f"{cur.path}: truncated GGUF header inside {cur.what}, a string array")
        if n > MAX_STRING:
            raise GgufFormatError(
                f"{cur.path}: {cur.what} holds a string of {n} bytes; labkit reads strings of at most {MAX_STRING}"
            )
        out.append(str(buf[pos : pos + n], "utf-8", "replace"))
        pos += n
    cur.pos = pos
    return out


def open_gguf(path: str | Path) -> GgufFile:
    """Map `path` and parse its header, checking every field before it is used, as llama.cpp's
    gguf.cpp does: a typed ModelFileError (labkit.errors) names the first defect."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a GGUF file")
    size = path.stat().st_size
    if size < 24:
        raise TruncatedFileError(f"{path}: too short to be a GGUF file ({size} bytes)")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mm), path)
    version, n_tensors, n_kv = _read_header(cur)
    metadata = _read_metadata(cur, n_kv)
    rows = [_read_tensor_row(cur, i) for i in range(n_tensors)]
    _check_unique_names(path, rows)
    alignment = _alignment(path, metadata)
    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    tensors = _place_tensors(path, rows, data_offset, alignment, size)
    return GgufFile(path, version, metadata, tensors, data_offset, mm)


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    """Magic, version and the two counts, each count bounded by what the file's size can hold."""
    magic = bytes(cur.take(4))
    if magic != GGUF_MAGIC:
        raise GgufFormatError(f"{cur.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = cur.unpack("<I")
    if version not in (2, 3):
        hint = " (a big-endian file?)" if version and version & 0xFFFF == 0 else ""
        raise GgufFormatError(f"{cur.path}: unsupported GGUF version {version}{hint}; labkit reads versions 2 and 3")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    if n_tensors * MIN_TENSOR_BYTES + n_kv * MIN_KV_BYTES > cur.left():
        raise TruncatedFileError(
            f"{cur.path}: the header claims {n_tensors} tensors and {n_kv} metadata keys, more than the "
            f"{len(cur.buf)}-byte file can hold (a truncated file, or counts that are wrong)"
        )
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
    """The key-value table: keys non-empty and unique (llama.cpp refuses both, never picks one)."""
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        at = cur.pos
        cur.what = f"metadata key {i}"
        key, n_bytes = cur.name(limit=MAX_KEY)
        if n_bytes >= MAX_KEY:
            raise MetadataKeyError(
                f"{cur.path}: metadata key {i}'s name {key[:80]!r} is {n_bytes} bytes; labkit reads key names "
                f"of fewer than {MAX_KEY} (a misread length?)"
            )
        if not key:
            raise MetadataKeyError(f"{cur.path}: metadata key {i} (byte {at}) is empty")
        if key in metadata:
            raise MetadataKeyError(f"{cur.path}: metadata key {key!r} is written twice (the second at byte {at})")
        cur.what = f"the value of {key!r}"
        vtype = cur.unpack("<I")
        if key == "general.alignment" and vtype != 4:  # gguf.cpp: a uint32, nothing else
            raise MetadataTypeError(f"{cur.path}: general.alignment has GGUF value type {vtype}, not a uint32 (4)")
        metadata[key] = _read_value(cur, vtype)
    return metadata


def _read_tensor_row(cur: _Cursor, i: int) -> tuple[str, list[int], int, int]:
    """One tensor table row: (name, ne in ggml order, type, offset), its dimensions checked."""
    cur.what = f"tensor {i}'s table entry"
    name, n_bytes = cur.name(limit=MAX_NAME)
    if n_bytes >= MAX_NAME:
        raise TensorTableError(
            f"{cur.path}: tensor {i}'s name {name[:80]!r} is {n_bytes} bytes; ggml allows {MAX_NAME - 1}"
        )
    n_dims = cur.unpack("<I")
    if n_dims > MAX_DIMS:
        raise TensorDimensionsError(
            f"{cur.path}: tensor {name!r} has {n_dims} dimensions; ggml tensors have at most {MAX_DIMS}"
        )
    ne = [cur.unpack("<Q") for _ in range(n_dims)] or [1]  # gguf.cpp: no dimension is a scalar, ne all 1
    if any(d > INT64_MAX for d in ne):
        raise TensorDimensionsError(f"{cur.path}: tensor {name!r} has a negative dimension (as int64): ne {ne}")
    if 0 in ne:
        raise TensorDimensionsError(f"{cur.path}: tensor {name!r} has a zero dimension: ne {ne}")
    if math.prod(ne) > INT64_MAX:
        raise TensorDimensionsError(f"{cur.path}: tensor {name!r}'s dimensions {ne} multiply past int64 (2^63 - 1)")
    return name, ne, cur.unpack("<I"), cur.unpack("<Q")


def _check_unique_names(path: Path, rows: list[tuple[str, list[int], int, int]]) -> None:
    seen: dict[str, int] = {}
    for i, (name, *_) in enumerate(rows):
        if name in seen:
            raise DuplicateTensorError(f"{path}: tensors {seen[name]} and {i} are both named {name!r}")
        seen[name] = i


def _alignment(path: Path, metadata: dict[str, Any]) -> int:
    """general.alignment: a uint32 power of two (gguf.cpp's rule), 32 when absent."""
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)  # its type checked as it was read
    if value <= 0 or value & (value - 1):
        raise GgufFormatError(f"{path}: general.alignment is {value}, not a power of two")
    return value


def _place_tensors(path: Path, rows: list, data_offset: int, alignment: int, size: int) -> dict[str, TensorInfo]:
    """Each row's type, row length and bytes, laid where llama.cpp's loader expects them: back to
    back in table order, each padded to the alignment, inside the file."""
    tensors: dict[str, TensorInfo] = {}
    expected = 0  # the next tensor's offset, relative to the data section
    for name, ne, ggml_type, rel_offset in rows:
        nbytes = _nbytes(path, name, ne, ggml_type)
        if rel_offset % alignment:
            raise TensorOffsetError(
                f"{path}: tensor {name!r}'s data offset {rel_offset} is not a multiple of "
                f"general.alignment ({alignment})"
            )
        start = data_offset + rel_offset
        if start + nbytes > size:
            raise TruncatedFileError(
                f"{path}: truncated file: tensor {name!r} needs bytes up to {start + nbytes}, file has {size}"
            )
        if rel_offset != expected:
            raise TensorOffsetError(
                f"{path}: tensor {name!r} " + _misplaced(tensors, start, nbytes, data_offset + expected)
            )
        tensors[name] = TensorInfo(name, ggml_type, tuple(reversed(ne)), start, nbytes)
        expected += (nbytes + alignment - 1) // alignment * alignment
    return tensors


def _nbytes(path: Path, name: str, ne: list[int], ggml_type: int) -> int:
    if ggml_type not in GGML_QUANT_SIZES:
        raise UnknownTensorTypeError(f"{path}: tensor {name!r} has ggml type {ggml_type}, which ggml does not define")
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if ne[0] % block:
        kind = GGMLQuantizationType(ggml_type).name
        raise TensorDimensionsError(
            f"{path}: tensor {name!r}'s row of {ne[0]} values is not a whole number of {kind} blocks of {block}"
        )
    return math.prod(ne) // block * type_size


def _misplaced(placed: dict[str, TensorInfo], start: int, nbytes: int, expected: int) -> str:
    """Why a tensor's bytes are not where the loader expects them: which tensor they overlap, or the gap."""
    span = f"bytes [{start}, {start + nbytes})"
    for other in placed.values():
        if start < other.offset + other.nbytes and other.offset < start + nbytes:
            return f"{span} overlap tensor {other.name!r}'s [{other.offset}, {other.offset + other.nbytes})"
    return (
        f"starts at byte {start}, where llama.cpp's loader expects byte {expected} "
        "(tensors lie back to back in table order)"
    )


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Only the metadata dict (used by tools that need the vocabulary)."""
    return open_gguf(path).metadata
