"""Repacking a weight on the GPU, from its GGUF bytes, into the layout the fast matmuls read.

The fast drivers (matmul_tiled.wgsl for prefill, matmul_matvec.wgsl for decode) want every
quant 4-byte aligned and each group's scale once, not GGUF's 34-byte Q8_0 or 210-byte Q6_K
blocks with fields straddling words. The repack kernel (labkit/ops/repack.wgsl) is composed
with the format's block reader, and with a faulty format variant's reader when that variant is
selected, so a format fault reaches the fast path too. It runs once per weight and reader; the
GGUF bytes stay on the GPU for the raw-bytes kernels.

A repacked row takes K + 8 K / GROUP bytes (Q8_0: 800 for K = 640, against 680 raw), rows
padded to a multiple of 4 (repack.wgsl has the layout), so the windows are re-cut to fit one
storage binding. Each new window remembers the GGUF window it came from (`part_of`): a
dispatch policy that leaves out "the last window" (post-mortem 002) leaves out the same rows
on either layout.
"""

from __future__ import annotations

from typing import Any

import wgpu

from labkit.errors import GpuLimitError, UnsupportedTensorTypeError
from labkit.gpu.dispatch import Dispatch, bind, grid, run, uniform_bytes
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.weights import GpuWeight, WeightWindow
from labkit.ops.base import wgsl_const
from labkit.ops.matmul import REPACK_PARAMS

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC


def repacked_bytes(n_rows: int, n_cols: int, group: int) -> int:
    """Bytes of a repacked window: rows padded to quads, K int8 quants and 8 bytes of (scale,
    offset) per group of each row."""
    return -(-n_rows // 4) * 4 * (n_cols + 8 * (n_cols // group))


def repack_weight(gpu: Any, weight: GpuWeight, source: str, max_binding: int | None = None) -> GpuWeight:
    """The weight in the repacked layout, computed on the GPU by `source` (common + quant + repack)."""
    group = wgsl_const(source, "GROUP", 0)
    K = weight.n_cols
    if group < 16 or K % 32:
        raise UnsupportedTensorTypeError(
            f"{weight.name}: {weight.type_name} has no repacked layout (needs integer quants and K % 32 == 0)"
        )
    limit = gpu.max_binding if max_binding is None else min(gpu.max_binding, int(max_binding))
    quad = repacked_bytes(4, K, group)
    if quad > limit:
        raise GpuLimitError(f"{weight.name}: four repacked rows ({quad} bytes) do not fit a binding ({limit} bytes)")
    per_window = limit // quad * 4
    pipeline = compile_pipeline(gpu, source, label=f"repack {weight.type_name}")
    windows, dispatches = [], []
    for index, src in enumerate(weight.windows):
        for first in range(0, src.n_rows, per_window):
            n = min(per_window, src.n_rows - first)
            label = f"{weight.name}[{src.first_row + first}:{src.first_row + first + n}] repacked"
            buf = gpu.device.create_buffer(label=label, size=repacked_bytes(n, K, group), usage=STORAGE)
            params = uniform_bytes(gpu, REPACK_PARAMS.pack(source, {"K": K, "rows": n, "row0": first}))
            n_wg = -(-n * (K // 4) // 64)
            dispatches.append(
                Dispatch(pipeline, bind(gpu, pipeline, [src.buffer, buf, params]), grid(n_wg), f"repack {label}")
            )
            windows.append(WeightWindow(buf, src.first_row + first, n, part_of=index))
    run(gpu, dispatches, f"repack {weight.name}")
    row_bytes = K + 8 * (K // group)
    return GpuWeight(weight.name, weight.ggml_type, weight.n_rows, K, row_bytes, windows, len(weight.windows))
