"""Dequantize ggml tensor bytes to float32 with vectorised numpy.

Each block format is transcribed from ggml's `dequantize_row_*` (ggml-quants.c):
the raw bytes are viewed as a packed structured array (one record per block, no
copy), and one small function per format turns records into `block_size` floats.
Arithmetic is done in float32 in the same order as ggml (e.g. `(d * sc) * q - dmin * m`),
so results match ggml bit for bit. Large tensors are processed in chunks of blocks
to bound the temporary memory; there is no Python loop over individual blocks.

`gguf.quants` is deliberately not used here: it serves as the independent oracle
in the tests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.errors import ModelFileError, UnsupportedTensorTypeError

T = GGMLQuantizationType
QK_K = 256  # super-block size of the k-quants
_CHUNK_BLOCKS = 1 << 15  # blocks per chunk: bounds temporaries to a few tens of MB


# --- block layouts (packed, little-endian; field order as in ggml-common.h) -------------

_BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
_BLOCK_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
_BLOCK_Q5_0 = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
_BLOCK_Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
_BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
_BLOCK_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
_BLOCK_Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)])
_BLOCK_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])


# --- shared bit helpers ------------------------------------------------------------------


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., L) bytes -> (..., 2, L): all low nibbles, then all high nibbles.

    ggml packs element j in the low nibble and element j + L in the high nibble of byte j.
    """
    return np.stack([qs & 0x0F, qs >> 4], axis=-2)


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def _col(x: np.ndarray) -> np.ndarray:
    """A per-block f16 scalar field as a float32 column, for broadcasting over the block."""
    return _f32(x)[:, None]


_BIT_INDEX_32 = np.arange(32, dtype=np.uint32)
_BIT_INDEX_8 = np.arange(8, dtype=np.uint8)[:, None]
_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]


def _qh_bits_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 fifth bits: element i of the 32-element block takes bit i of the u32 `qh`."""
    return ((qh[:, None] >> _BIT_INDEX_32) & 1).astype(np.uint8)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks at once: 12 bytes -> 8 six-bit (sc, m).

    Sub-blocks 0-3 keep their low 6 bits in bytes 0-3 (scale) and 4-7 (min). Sub-blocks 4-7
    keep their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the spare
    top 2 bits of bytes 0-3 (scale) and 4-7 (min).
    """
    lo_sc, lo_m, packed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (packed & 0x0F) | ((lo_sc >> 6) << 4)], axis=1)
    m = np.concatenate([lo_m & 63, (packed >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, m


# --- one function per format: structured blocks (n,) -> float32 (n, block_size) ---------


def _deq_q4_0(b: np.ndarray) -> np.ndarray:
    """32 four-bit values, offset by 8, times one f16 scale."""
    q = _nibbles(b["qs"]).reshape(len(b), 32).astype(np.int16) - 8
    return _f32(q) * _col(b["d"])


def _deq_q4_1(b: np.ndarray) -> np.ndarray:
    """32 unsigned four-bit values: q * d + m."""
    q = _f32(_nibbles(b["qs"]).reshape(len(b), 32))
    return q * _col(b["d"]) + _col(b["m"])


def _deq_q5_0(b: np.ndarray) -> np.ndarray:
    """Q4_0 plus a fifth bit per value from the u32 `qh`; offset 16."""
    q = _nibbles(b["qs"]).reshape(len(b), 32) | (_qh_bits_32(b["qh"]) << 4)
    return _f32(q.astype(np.int16) - 16) * _col(b["d"])


def _deq_q5_1(b: np.ndarray) -> np.ndarray:
    """Q4_1 plus a fifth bit per value from the u32 `qh`: q * d + m."""
    q = _nibbles(b["qs"]).reshape(len(b), 32) | (_qh_bits_32(b["qh"]) << 4)
    return _f32(q) * _col(b["d"]) + _col(b["m"])


def _deq_q8_0(b: np.ndarray) -> np.ndarray:
    """32 signed bytes times one f16 scale."""
    return _f32(b["qs"]) * _col(b["d"])


def _deq_q4_k(b: np.ndarray) -> np.ndarray:
    """256 values in 8 sub-blocks of 32, each with a 6-bit scale and min (see _scale_min_k4).

    The 128 `qs` bytes are 4 chunks of 32: the low nibbles are sub-block 2k, the high
    nibbles sub-block 2k+1. Value = (d * sc) * q - (dmin * m).
    """
    n = len(b)
    sc, m = _scale_min_k4(b["scales"])
    d = (_col(b["d"]) * _f32(sc))[:, :, None]
    dm = (_col(b["dmin"]) * _f32(m))[:, :, None]
    q = _f32(_nibbles(b["qs"].reshape(n, 4, 32)).reshape(n, 8, 32))
    return (d * q - dm).reshape(n, QK_K)


def _deq_q5_k(b: np.ndarray) -> np.ndarray:
    """Q4_K plus a fifth bit: sub-block s takes bit s of `qh[l]` for its element l."""
    n = len(b)
    sc, m = _scale_min_k4(b["scales"])
    d = (_col(b["d"]) * _f32(sc))[:, :, None]
    dm = (_col(b["dmin"]) * _f32(m))[:, :, None]
    low = _nibbles(b["qs"].reshape(n, 4, 32)).reshape(n, 8, 32)
    high = (b["qh"][:, None, :] >> _BIT_INDEX_8) & 1
    q = _f32(low | (high << 4))
    return (d * q - dm).reshape(n, QK_K)


def _deq_q6_k(b: np.ndarray) -> np.ndarray:
    """256 six-bit values (offset 32) in 16 groups of 16, each with an int8 scale.

    Each half of 128 outputs uses 64 `ql` bytes and 32 `qh` bytes. Its four groups of
    32 (g = 0..3) take the low nibbles of ql[0:32], ql[32:64], then the high nibbles of
    ql[0:32], ql[32:64], and bits 2g..2g+1 of qh[0:32] as the top two bits. Element l of
    group g in half h uses scale 8h + 2g + l // 16. Value = (d * scale) * q.
    """
    n = len(b)
    low = _nibbles(b["ql"].reshape(n, 2, 64)).reshape(n, 2, 4, 32)  # g = 2 * nibble + (l >= 32)
    high = (b["qh"].reshape(n, 2, 1, 32) >> _SHIFT_2BIT) & 3
    q = _f32((low | (high << 4)).astype(np.int16) - 32).reshape(n, 2, 4, 2, 16)
    ds = (_col(b["d"]) * _f32(b["scales"])).reshape(n, 2, 4, 2, 1)
    return (ds * q).reshape(n, QK_K)


_BLOCK_FORMATS: dict[int, tuple[np.dtype, Callable[[np.ndarray], np.ndarray]]] = {
    T.Q4_0: (_BLOCK_Q4_0, _deq_q4_0),
    T.Q4_1: (_BLOCK_Q4_1, _deq_q4_1),
    T.Q5_0: (_BLOCK_Q5_0, _deq_q5_0),
    T.Q5_1: (_BLOCK_Q5_1, _deq_q5_1),
    T.Q8_0: (_BLOCK_Q8_0, _deq_q8_0),
    T.Q4_K: (_BLOCK_Q4_K, _deq_q4_k),
    T.Q5_K: (_BLOCK_Q5_K, _deq_q5_k),
    T.Q6_K: (_BLOCK_Q6_K, _deq_q6_k),
}

# Plain float types: one element per "block", converted by a dtype view.
_FLOAT_FORMATS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    T.F32: lambda raw: raw.view("<f4").astype(np.float32),
    T.F16: lambda raw: raw.view("<f2").astype(np.float32),
    # bf16 is the top half of an f32: shift the 16 bits up and reinterpret.
    T.BF16: lambda raw: (raw.view("<u2").astype(np.uint32) << 16).view(np.float32),
}

SUPPORTED_TYPES: frozenset[int] = frozenset(int(t) for t in (*_FLOAT_FORMATS, *_BLOCK_FORMATS))

for _t, (_dtype, _) in _BLOCK_FORMATS.items():  # the layouts must agree with gguf's sizes
    assert _dtype.itemsize == GGML_QUANT_SIZES[T(_t)][1], T(_t).name


# --- public API --------------------------------------------------------------------------


def _type_name(ggml_type: int) -> str:
    try:
        return f"{T(ggml_type).name} (ggml type {int(ggml_type)})"
    except ValueError:
        return f"unknown ggml type {ggml_type}"


def _check_supported(ggml_type: int) -> None:
    if ggml_type not in SUPPORTED_TYPES:
        names = ", ".join(T(t).name for t in sorted(SUPPORTED_TYPES))
        raise UnsupportedTensorTypeError(f"cannot dequantize {_type_name(ggml_type)}; supported types: {names}")


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of `n_cols` values. Raises if `n_cols` is not a whole number of blocks."""
    _check_supported(ggml_type)
    block_size, type_size = GGML_QUANT_SIZES[T(ggml_type)]
    if n_cols % block_size:
        raise ModelFileError(
            f"row of {n_cols} values is not a whole number of {_type_name(ggml_type)} blocks of {block_size}"
        )
    return n_cols // block_size * type_size


def _as_bytes(raw: np.ndarray) -> np.ndarray:
    """A flat, contiguous, plain-ndarray uint8 view (no copy for memmap slices)."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return np.ascontiguousarray(raw).reshape(-1)


def _dequantize_bytes(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Flat uint8 bytes (a whole number of blocks) -> flat float32 values."""
    if ggml_type in _FLOAT_FORMATS:
        return _FLOAT_FORMATS[ggml_type](raw)
    block_dtype, decode = _BLOCK_FORMATS[ggml_type]
    blocks = raw.view(block_dtype)
    block_size = GGML_QUANT_SIZES[T(ggml_type)][0]
    out = np.empty((len(blocks), block_size), dtype=np.float32)
    for start in range(0, len(blocks), _CHUNK_BLOCKS):
        chunk = slice(start, start + _CHUNK_BLOCKS)
        out[chunk] = decode(blocks[chunk])
    return out.reshape(-1)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize a whole tensor.

    raw: uint8 array (may be a read-only np.memmap slice) of exactly the tensor's bytes.
    ggml_type: int value of gguf.GGMLQuantizationType.
    shape: numpy order (reversed GGUF ne order); the last dim is the contiguous one.
    Returns a new, writable float32 array of `shape`.
    """
    _check_supported(ggml_type)
    shape = tuple(int(s) for s in shape)
    n_cols = shape[-1] if shape else 1
    n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    raw = _as_bytes(raw)
    expected = n_rows * row_bytes(ggml_type, n_cols)
    if raw.size != expected:
        raise ModelFileError(f"{_type_name(ggml_type)} tensor of shape {shape} needs {expected} bytes, got {raw.size}")
    return _dequantize_bytes(raw, ggml_type).reshape(shape)


def dequantize_rows(raw: np.ndarray, ggml_type: int, n_cols: int, rows: slice | np.ndarray) -> np.ndarray:
    """Dequantize only the selected rows of a 2-D tensor (e.g. an embedding lookup).

    Only the selected rows' bytes are read, so this is cheap on a memmap of a large
    embedding table. `rows` is a slice or an integer index array (numpy indexing rules).
    Returns float32 [n_rows_selected, n_cols].
    """
    n_row_bytes = row_bytes(ggml_type, n_cols)
    raw = _as_bytes(raw)
    if n_row_bytes == 0 or raw.size % n_row_bytes:
        raise ModelFileError(
            f"{raw.size} bytes is not a whole number of {_type_name(ggml_type)} rows "
            f"of {n_cols} values ({n_row_bytes} bytes each)"
        )
    table = raw.reshape(-1, n_row_bytes)
    if not isinstance(rows, slice):
        rows = np.asarray(rows, dtype=np.intp).reshape(-1)
    selected = np.ascontiguousarray(table[rows]).reshape(-1)
    return _dequantize_bytes(selected, ggml_type).reshape(-1, n_cols)
