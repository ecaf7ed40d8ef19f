"""Dequantize GGUF tensor bytes to float32 on the host, with `gguf.quants.dequantize`.

labkit used to carry its own numpy transcription of ggml's `dequantize_row_*`. gguf-py's is
bit-identical on every tensor of both real models and fast enough, so it replaced it. Measured
here (2 cores, every tensor of each file, labkit's former decoder → gguf.quants):
gemma3-270m 3.66 s → 5.03 s (Q8_0 2.52 → 3.58 s, Q5_0 0.78 → 1.06 s, Q4_K 0.24 → 0.27 s,
Q6_K 0.11 → 0.12 s); smollm2-135m 1.29 s → 1.18 s. That is 1.4 s more once per reference
lab, against about 7 s for its first pass; the GPU path dequantizes only norm vectors and the
embedding rows of the prompt's tokens.

What stays here is what gguf.quants does not do: checking that the bytes fit the type and
shape (a truncated or corrupt file is a ModelFileError, not a numpy error), reading only the
selected rows of a memory-mapped table, and bounding temporaries by decoding in row chunks.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from labkit.errors import ModelFileError, UnsupportedTensorTypeError
from labkit.quant.formats import QUANT_FORMATS, QuantFormat, quant_format, type_label

T = GGMLQuantizationType
SUPPORTED_TYPES = frozenset(QUANT_FORMATS)  # every type gguf.quants dequantizes (quant/formats.py)
# Bytes of blocks decoded in one gguf.quants call. A chunk goes in as one row of blocks: gguf.quants
# loops in Python over groups of 16 rows, 10 KB of a SmolLM2 row each, and its per-group cost
# made up over half the time (a call per MB: 2.3x faster on SmolLM2's weights, the same values,
# since every GGUF type decodes block by block). Temporaries stay about 20x this as floats.
_CHUNK_BYTES = 1 << 20


def _check_supported(ggml_type: int) -> QuantFormat:
    fmt = quant_format(ggml_type)
    if fmt is None:
        names = ", ".join(T(t).name for t in sorted(SUPPORTED_TYPES))
        raise UnsupportedTensorTypeError(f"cannot dequantize {type_label(ggml_type)}; supported types: {names}")
    return fmt


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of `n_cols` values. Raises if `n_cols` is not a whole number of blocks."""
    fmt = _check_supported(ggml_type)
    n = fmt.row_bytes(n_cols)
    if n is None:
        raise ModelFileError(
            f"row of {n_cols} values is not a whole number of {type_label(ggml_type)} blocks of {fmt.block_size}"
        )
    return n


def row_table(raw: np.ndarray, ggml_type: int, n_cols: int) -> np.ndarray:
    """The bytes as a [rows, row_bytes] uint8 table (no copy for memmap slices); ModelFileError
    when they are not a whole number of rows."""
    n_row_bytes = row_bytes(ggml_type, n_cols)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    raw = raw.reshape(-1)
    if n_row_bytes == 0 or raw.size % n_row_bytes:
        raise ModelFileError(
            f"{raw.size} bytes is not a whole number of {type_label(ggml_type)} rows "
            f"of {n_cols} values ({n_row_bytes} bytes each)"
        )
    return raw.reshape(-1, n_row_bytes)


def _decode(table: np.ndarray, ggml_type: int, n_cols: int) -> np.ndarray:
    """[rows, row_bytes] bytes → float32 [rows, n_cols], a chunk of rows at a time."""
    out = np.empty((table.shape[0], n_cols), dtype=np.float32)
    step = max(1, _CHUNK_BYTES // max(table.shape[1], 1))
    for r0 in range(0, table.shape[0], step):
        chunk = np.ascontiguousarray(table[r0 : r0 + step]).reshape(1, -1)  # one row: one call (above)
        out[r0 : r0 + step] = gguf_dequantize(chunk, T(ggml_type)).reshape(-1, n_cols)
    return out


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize a whole tensor.

    raw: uint8 array (may be a read-only np.memmap slice) of exactly the tensor's bytes.
    ggml_type: int value of gguf.GGMLQuantizationType.
    shape: numpy order (reversed GGUF ne order); the last dim is the contiguous one.
    Returns a new, writable float32 array of `shape`.
    """
    shape = tuple(int(s) for s in shape)
    n_cols = shape[-1] if shape else 1
    n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    expected, got = n_rows * row_bytes(ggml_type, n_cols), np.asarray(raw).nbytes
    if got != expected:
        raise ModelFileError(f"{type_label(ggml_type)} tensor of shape {shape} needs {expected} bytes, got {got}")
    return _decode(row_table(raw, ggml_type, n_cols), ggml_type, n_cols).reshape(shape)


def dequantize_rows(raw: np.ndarray, ggml_type: int, n_cols: int, rows: slice | np.ndarray) -> np.ndarray:
    """Dequantize only the selected rows of a 2-D tensor (e.g. an embedding lookup).

    Only the selected rows' bytes are read, so this is cheap on a memmap of a large
    embedding table. `rows` is a slice or an integer index array (numpy indexing rules).
    Returns float32 [n_rows_selected, n_cols].
    """
    table = row_table(raw, ggml_type, n_cols)
    if not isinstance(rows, slice):
        rows = np.asarray(rows, dtype=np.intp).reshape(-1)
    return _decode(table[rows], ggml_type, n_cols)
