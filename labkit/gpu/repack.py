"""Repacking a weight on the GPU, from its GGUF bytes, into the layout the fast matmuls read.

The fast drivers (matmul_tiled.wgsl for prefill, matmul_matvec.wgsl for decode) want every
quant 4-byte aligned and each group's scale once, not GGUF's 34-byte Q8_0 or 210-byte Q6_K
blocks with fields straddling words. The repack kernel (labkit/ops/repack.wgsl) is composed
with the format's block reader, and with a faulty format variant's reader when that variant is
selected, so a format fault reaches the fast path too. It runs once per weight and reader; the
GGUF bytes stay on the GPU for the raw-bytes kernels.

Each repacked window lives in a texture, SLOT_ROW texels of 16 bytes per texture row: the
drivers read it with textureLoad, which lavapipe gathers for all lanes at once (7.7-8.4 GB/s
here), where a storage-buffer read goes lane by lane (1.1 GB/s). Windows are repacked in turn
through one 16 MiB staging buffer and copied into their textures, so no second copy of the
weight is ever held.

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
from labkit.gpu.dispatch import Dispatch, bind, encode, grid, uniform_bytes, wait_idle
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.weights import GpuWeight, WeightWindow
from labkit.ops.base import wgsl_const, wgsl_file
from labkit.ops.matmul import REPACK_PARAMS

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
TEXTURE_FORMAT = wgpu.TextureFormat.rgba32uint
TEXTURE_USAGE = wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_DST
REPACK_BUFFER = 16 << 20  # the most bytes of one window: the staging buffer every window is repacked through
SLOT_ROW = wgsl_const(wgsl_file("repacked"), "SLOT_ROW", 0)  # texels per texture row
SLOT_BYTES = 16  # one rgba32uint texel: one vec4<u32> slot
MAX_TEXTURE_ROWS = 8192  # WebGPU's guaranteed max-texture-dimension-2d


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
    limit = min(limit, SLOT_ROW * MAX_TEXTURE_ROWS * SLOT_BYTES)
    quad = repacked_bytes(4, K, group)
    if quad > limit:
        raise GpuLimitError(f"{weight.name}: four repacked rows ({quad} bytes) do not fit a binding ({limit} bytes)")
    per_window = min(limit, REPACK_BUFFER) // quad * 4
    pipeline = compile_pipeline(gpu, source, label=f"repack {weight.type_name}")
    staging = gpu.device.create_buffer(label=f"{weight.name} repack", size=_padded(per_window, K, group), usage=STORAGE)
    windows = []
    for index, src in enumerate(weight.windows):
        for first in range(0, src.n_rows, per_window):
            n = min(per_window, src.n_rows - first)
            label = f"{weight.name}[{src.first_row + first}:{src.first_row + first + n}] repacked"
            params = uniform_bytes(gpu, REPACK_PARAMS.pack(source, {"K": K, "rows": n, "row0": first}))
            n_wg = -(-n * (K // 4) // 64)
            bg = bind(gpu, pipeline, [src.buffer, (staging, 0, repacked_bytes(n, K, group)), params])
            enc = gpu.device.create_command_encoder(label=f"repack {label}")
            encode(enc, [Dispatch(pipeline, bg, grid(n_wg), f"repack {label}")])
            texture = _copy_to_texture(gpu, enc, staging, _padded(n, K, group), label)
            gpu.queue.submit([enc.finish()])
            wait_idle(gpu)  # one window at a time: what the driver holds for a copy never piles up
            windows.append(WeightWindow(texture.create_view(), src.first_row + first, n, index, _padded(n, K, group)))
    staging.destroy()
    row_bytes = K + 8 * (K // group)
    return GpuWeight(weight.name, weight.ggml_type, weight.n_rows, K, row_bytes, windows, len(weight.windows))


def _padded(n_rows: int, n_cols: int, group: int) -> int:
    """Bytes of a repacked window's texture: whole texture rows of SLOT_ROW slots."""
    row = SLOT_ROW * SLOT_BYTES
    return -(-repacked_bytes(n_rows, n_cols, group) // row) * row


def _copy_to_texture(gpu: Any, enc: Any, staging: Any, nbytes: int, label: str) -> Any:
    """A new texture holding the first `nbytes` (whole texture rows) of `staging`, copied in `enc`.
    Written by a copy, not by textureStore: on lavapipe a texture with storage usage reads
    1.4x slower."""
    height = nbytes // (SLOT_ROW * SLOT_BYTES)
    texture = gpu.device.create_texture(label=label, size=(SLOT_ROW, height, 1), format=TEXTURE_FORMAT,
                                        usage=TEXTURE_USAGE)  # fmt: skip
    layout = {"buffer": staging, "offset": 0, "bytes_per_row": SLOT_ROW * SLOT_BYTES, "rows_per_image": height}
    enc.copy_buffer_to_texture(layout, {"texture": texture}, (SLOT_ROW, height, 1))
    return texture
