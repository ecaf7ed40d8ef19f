"""Weights on the GPU: the GGUF bytes, unchanged, in row windows.

A tensor's bytes are uploaded as they are in the file (no dequantization on the host); the
kernels read them as `array<u32>`. A tensor larger than max-storage-buffer-binding-size
(128 MiB on lavapipe; Gemma 3's 262 144 x 640 Q8_0 embedding is 178 MB) is split by rows
into windows, each its own buffer, each bindable whole. Buffers are padded to a multiple
of 16 bytes (the pad is zero). Uploads go in chunks of at most 16 MiB straight from the
(possibly memory-mapped, read-only) source, so no whole-tensor host copy is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import wgpu
from gguf import GGMLQuantizationType

from labkit.errors import GpuLimitError, TensorDataError, UnsupportedTensorTypeError
from labkit.quant.formats import quant_format, type_label

UPLOAD_CHUNK = 16 << 20


@dataclass
class WeightWindow:
    buffer: Any  # what a kernel binds: a buffer of GGUF bytes, or a repacked window's texture view
    first_row: int
    n_rows: int
    part_of: int | None = None  # a repacked window: the index of the GGUF window it came from
    nbytes: int = 0  # bytes it holds on the device


@dataclass
class GpuWeight:
    name: str
    ggml_type: int
    n_rows: int
    n_cols: int
    row_bytes: int
    windows: list[WeightWindow]
    source_windows: int | None = None  # repacked: how many GGUF windows the windows were cut from

    def window_index(self, i: int) -> tuple[int, int]:
        """(index, count) of window i among the GGUF windows: what a window filter decides on."""
        w = self.windows[i]
        if w.part_of is None:
            return i, len(self.windows)
        return w.part_of, int(self.source_windows or 0)

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def nbytes(self) -> int:
        return self.n_rows * self.row_bytes


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of n_cols values in the given ggml type (its QuantFormat record)."""
    fmt = quant_format(ggml_type)
    n = None if fmt is None else fmt.row_bytes(n_cols)
    if n is None:
        why = "labkit does not read it" if fmt is None else f"rows hold blocks of {fmt.block_size} values"
        raise UnsupportedTensorTypeError(f"{type_label(ggml_type)}: {why}; {n_cols} columns")
    return n


def _upload(gpu: Any, buf: Any, src: np.ndarray) -> None:
    """Write src (uint8, any length) at offset 0 of buf in ≤ UPLOAD_CHUNK pieces."""
    n = src.nbytes
    whole = n - n % 4
    for start in range(0, whole, UPLOAD_CHUNK):
        end = min(start + UPLOAD_CHUNK, whole)
        gpu.queue.write_buffer(buf, start, src[start:end])
    if whole < n:  # a 1..3-byte tail: write it zero-padded to one word
        tail = np.zeros(4, dtype=np.uint8)
        tail[: n - whole] = src[whole:]
        gpu.queue.write_buffer(buf, whole, tail)


def upload_weight(
    gpu: Any,
    name: str,
    raw: np.ndarray,
    ggml_type: int,
    n_rows: int,
    n_cols: int,
    max_window_bytes: int | None = None,
    row_multiple: int = 1,
) -> GpuWeight:
    """Upload a tensor's GGUF bytes (uint8, exactly n_rows rows) into row windows, each a multiple of
    `row_multiple` rows (a 3-D expert tensor's windows hold whole experts)."""
    rb = row_bytes(ggml_type, n_cols)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    raw = raw.reshape(-1)
    if raw.nbytes != n_rows * rb:
        raise TensorDataError(f"{name}: {raw.nbytes} bytes given, {n_rows} rows x {rb} bytes = {n_rows * rb} expected")
    limit = gpu.max_binding
    if max_window_bytes is not None:
        limit = min(limit, int(max_window_bytes))
    limit -= limit % 16  # the padded buffer must fit too
    if rb * row_multiple > limit:
        what = "one row" if row_multiple == 1 else f"one expert ({row_multiple} rows)"
        raise GpuLimitError(f"{name}: {what} takes {rb * row_multiple} bytes, more than a window ({limit} bytes)")
    rows_per_window = limit // rb // row_multiple * row_multiple
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    windows = []
    for first in range(0, n_rows, rows_per_window):
        n = min(rows_per_window, n_rows - first)
        size = max(16, -(-n * rb // 16) * 16)
        label = f"{name}[{first}:{first + n}]"
        buf = gpu.device.create_buffer(label=label, size=size, usage=usage)
        _upload(gpu, buf, raw[first * rb : (first + n) * rb])
        windows.append(WeightWindow(buf, first, n, nbytes=size))
    return GpuWeight(name, int(ggml_type), n_rows, n_cols, rb, windows)
