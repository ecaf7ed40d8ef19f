"""Repacking a weight on the GPU, from its GGUF bytes, into the layout the fast matmuls read.

The fast drivers (matmul_tiled.wgsl for prefill, matmul_matvec.wgsl for decode) want every
quant 4-byte aligned and each group's scale once, not GGUF's 34-byte Q8_0 or 210-byte Q6_K
blocks with fields straddling words. The repack kernel (labkit/ops/matmul/repack.wgsl) is composed
with the format's block reader, and with a faulty format variant's reader when that variant is
selected, so a format fault reaches the fast path too. It runs once per weight and reader; the
GGUF bytes stay on the GPU for the raw-bytes kernels.

Each repacked window lives in a texture, SLOT_ROW texels of 16 bytes per texture row: the
drivers read it with textureLoad, which lavapipe gathers for all lanes at once (7.7-8.4 GB/s
here), where a storage-buffer read goes lane by lane (1.1 GB/s). Windows are repacked in turn
through one 16 MiB staging buffer and copied into their textures, so no second copy of the
weight is ever held.

Two layouts, told apart by the repack source (`layout_of`):
- int8 (repack.wgsl): a row takes K + 8 K / GROUP bytes (Q8_0: 800 for K = 640, against 680
  raw), rows padded to a multiple of 4. Any integer format, through its block reader.
- blocks (blocks_repack.wgsl): the GGUF blocks unchanged, each padded to whole 16-byte texels
  (BLOCK_TEXELS): Q4_K 144 bytes, Q5_K 176, Q6_K 224 for 210. Near the format's own width; read
  by the format's own drivers (labkit.ops.matmul.BLOCK_DRIVERS). The legacy formats (Q8_0, Q4_0,
  Q4_1, Q5_0) group 8 blocks by field instead (`group_by_field`, written from the host only).
  Rows go in quads, a quad's 4 rows side by side block by block (blocks_quads.wgsl, `by_quads`):
  a decode thread's 4 rows are read from one run of texels.
The windows are re-cut to fit one storage binding. Each new window remembers the GGUF window it came from (`part_of`): a
dispatch policy that leaves out "the last window" (post-mortem 002) leaves out the same rows
on either layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import wgpu
from gguf import GGMLQuantizationType

from labkit.errors import GpuLimitError, UnsupportedTensorTypeError
from labkit.gpu.dispatch import Dispatch, encode, grid, wait_idle
from labkit.gpu.quant_table_buffer import tables_bind_group
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
QUAD = wgsl_const(wgsl_file("blocks_quads"), "QUAD", 0)  # rows side by side in the blocks layout
# Windows are cut at multiples of this many rows where that many fit: a multiple of every driver's
# rows per workgroup on repacked weights (128), so only a weight's last window leaves a workgroup
# computing rows past its end. Cut at 4 rows, an 8B ffn_down's 1336-row windows left most of their
# last workgroup's rows copies.
WINDOW_ROWS = 256


def repacked_bytes(n_rows: int, n_cols: int, group: int) -> int:
    """Bytes of an int8-repacked window: rows padded to quads, K int8 quants and 8 bytes of
    (scale, offset) per group of each row."""
    return -(-n_rows // 4) * 4 * (n_cols + 8 * (n_cols // group))


@dataclass(frozen=True)
class RepackLayout:
    """What a repack source writes: the bytes of a window of rows, and the invocations it takes."""

    name: str  # "int8" or "blocks"
    group: int  # int8: values per (scale, offset); blocks: values per block (QK)
    block_texels: int  # blocks: 16-byte texels per unit (a block, or a group of blocks); int8: 0
    block_bytes: int = 0  # blocks: the GGUF block's bytes
    per_unit: int = 1  # blocks: GGUF blocks per unit (8: the legacy formats' groups, blocks_group.wgsl)

    def row_bytes(self, K: int) -> int:
        if self.block_texels:
            return -(-(K // self.group) // self.per_unit) * self.block_texels * SLOT_BYTES
        return K + 8 * (K // self.group)

    def window_bytes(self, n_rows: int, K: int) -> int:
        if self.block_texels:  # whole quads
            return -(-n_rows // QUAD) * QUAD * self.row_bytes(K)
        return repacked_bytes(n_rows, K, self.group)

    def invocations(self, n_rows: int, K: int) -> int:
        """int8: one per (row, word of quants); blocks: one per word written."""
        return self.window_bytes(n_rows, K) // 4 if self.block_texels else n_rows * K // 4

    def check(self, name: str, type_name: str, K: int) -> None:
        if self.block_texels and K % self.group == 0:
            return
        if not self.block_texels and self.group >= 16 and K % 32 == 0:
            return
        raise UnsupportedTensorTypeError(
            f"{name}: {type_name} has no repacked layout ({self.name}) for K = {K} (needs integer quants and K % "
            f"{self.group if self.block_texels else 32} == 0)"
        )


@lru_cache(maxsize=256)
def layout_of(source: str) -> RepackLayout:
    """The layout a repack source writes: blocks when it declares BLOCK_TEXELS, else int8. Cached:
    the memory plan asks it for every matmul stage of every pass (sources are cached strings)."""
    texels = wgsl_const(source, "BLOCK_TEXELS", 0)
    if texels:
        return RepackLayout("blocks", wgsl_const(source, "QK", 1), texels, wgsl_const(source, "BLOCK_BYTES", 0),
                            wgsl_const(source, "BLOCKS_PER_UNIT", 1))  # fmt: skip
    return RepackLayout("int8", wgsl_const(source, "GROUP", 0), 0)


def window_rows(layout: RepackLayout, K: int, limit: int) -> int:
    """Rows of a repacked window: as many as fit the repack buffer and one binding (`limit`), in
    WINDOW_ROWS where those fit, else in quads (at least one)."""
    room = min(limit, SLOT_ROW * MAX_TEXTURE_ROWS * SLOT_BYTES, REPACK_BUFFER)
    step = WINDOW_ROWS if layout.window_bytes(WINDOW_ROWS, K) <= room else QUAD
    return max(QUAD, room // layout.window_bytes(step, K) * step)


def stored_bytes(layout: RepackLayout, n_rows: int, K: int, limit: int) -> int:
    """Bytes a repacked weight takes in its textures (each window padded to whole texture rows),
    for a weight uploaded in one GGUF window: what the memory plan counts."""
    per_window = window_rows(layout, K, limit)
    full, rest = divmod(n_rows, per_window)
    return full * _padded(layout.window_bytes(per_window, K)) + (_padded(layout.window_bytes(rest, K)) if rest else 0)


def repack_weight(gpu: Any, weight: GpuWeight, source: str, max_binding: int | None = None) -> GpuWeight:
    """The weight in the repacked layout, computed on the GPU by `source` (common + quant + repack)."""
    layout = layout_of(source)
    K = weight.n_cols
    layout.check(weight.name, weight.type_name, K)
    limit = gpu.max_binding if max_binding is None else min(gpu.max_binding, int(max_binding))
    limit = min(limit, SLOT_ROW * MAX_TEXTURE_ROWS * SLOT_BYTES)
    quad = layout.window_bytes(4, K)
    if quad > limit:
        raise GpuLimitError(f"{weight.name}: four repacked rows ({quad} bytes) do not fit a binding ({limit} bytes)")
    per_window = window_rows(layout, K, limit)
    if layout.per_unit > 1:
        raise UnsupportedTensorTypeError(
            f"{weight.name}: the grouped blocks layout of {weight.type_name} is written from the host (upload_blocks)"
        )
    pipeline = compile_pipeline(gpu, source, label=f"repack {weight.type_name}")
    size = _padded(layout.window_bytes(per_window, K))
    staging = gpu.device.create_buffer(label=f"{weight.name} repack", size=size, usage=STORAGE)
    tables = tables_bind_group(gpu, pipeline, source)
    windows = []
    for index, src in enumerate(weight.windows):
        for first in range(0, src.n_rows, per_window):
            n = min(per_window, src.n_rows - first)
            label = f"{weight.name}[{src.first_row + first}:{src.first_row + first + n}] repacked"
            params = gpu.fresh.uniform(REPACK_PARAMS.pack(source, {"K": K, "rows": n, "row0": first}))
            n_wg = -(-layout.invocations(n, K) // 64)
            bg = gpu.fresh.bind(pipeline, [src.buffer, (staging, 0, layout.window_bytes(n, K)), params])
            enc = gpu.device.create_command_encoder(label=f"repack {label}")
            encode(enc, [Dispatch(pipeline, bg, grid(n_wg), f"repack {label}", tables)])
            nbytes = _padded(layout.window_bytes(n, K))
            texture = _copy_to_texture(gpu, enc, staging, nbytes, label)
            gpu.queue.submit([enc.finish()])
            wait_idle(gpu)  # one window at a time: what the driver holds for a copy never piles up
            windows.append(WeightWindow(texture.create_view(), src.first_row + first, n, index, nbytes))
    staging.destroy()
    row_bytes = layout.row_bytes(K)
    return GpuWeight(weight.name, weight.ggml_type, weight.n_rows, K, row_bytes, windows, len(weight.windows))


def upload_blocks(gpu: Any, name: str, raw: np.ndarray, ggml_type: int, n_rows: int, K: int, layout: RepackLayout,
                  max_binding: int | None = None, gguf_window_bytes: int | None = None) -> GpuWeight:  # fmt: skip
    """A weight in the blocks layout straight from its GGUF bytes on the host: each window's blocks
    (padded to whole texels where the block is not) written into its texture, with no GPU buffer
    or kernel on the way. What the weight store does; `repack_weight` does the same on the GPU
    from an uploaded weight (the two are tested equal). Windows are cut inside the row windows the
    GGUF bytes would have (`part_of`), as repack_weight's are."""
    layout.check(name, GGMLQuantizationType(ggml_type).name, K)
    limit = gpu.max_binding if max_binding is None else min(gpu.max_binding, int(max_binding))
    per_window = window_rows(layout, K, limit)
    blocks = np.asarray(raw).reshape(n_rows * (K // layout.group), -1)  # one GGUF block a row
    row_blocks = K // layout.group
    gguf_rows = _gguf_window_rows(gpu, blocks.shape[1] * row_blocks, gguf_window_bytes)
    windows = []
    for index, g0 in enumerate(range(0, n_rows, gguf_rows)):
        for first in range(g0, min(g0 + gguf_rows, n_rows), per_window):
            n = min(per_window, g0 + gguf_rows - first, n_rows - first)
            part = blocks[first * row_blocks : (first + n) * row_blocks]
            unit = layout.block_texels * SLOT_BYTES  # a block padded to whole texels, or a group
            if layout.per_unit > 1:  # 8 blocks at a time, by field
                part = group_by_field(part, n, row_blocks, int(ggml_type), layout).reshape(n, -1, unit)
            part = by_quads(part.reshape(n, -1, part.shape[-1]), unit)
            nbytes = _padded(layout.window_bytes(n, K))
            label = f"{name}[{first}:{first + n}] blocks"
            texture = gpu.device.create_texture(label=label, size=(SLOT_ROW, nbytes // (SLOT_ROW * SLOT_BYTES), 1),
                                                format=TEXTURE_FORMAT, usage=TEXTURE_USAGE)  # fmt: skip
            wait_idle(gpu)  # the last window's staged copy is done and freed: never more than one
            _write_rows(gpu, part.reshape(-1), texture)
            gpu.queue.submit([])  # the copy starts, on the driver's thread, while the next window is ordered
            del part
            windows.append(WeightWindow(texture.create_view(), first, n, index, nbytes))
    count = -(-n_rows // gguf_rows)
    return GpuWeight(name, int(ggml_type), n_rows, K, layout.row_bytes(K), windows, count)


def by_quads(units: np.ndarray, unit_bytes: int) -> np.ndarray:
    """A window's rows of units ([rows, units a row, bytes]) in the blocks layout's order: rows in
    quads, the last filled up with zero rows, a quad's rows side by side unit by unit
    (blocks_quads.wgsl), each unit padded with zeros to `unit_bytes` (whole texels). The bytes are
    copied once, from the mapped file into that order: an 8B file's first pass moves 5 GB through here."""
    n_rows, per_row, unit = units.shape
    full = n_rows // QUAD
    out = np.empty((-(-n_rows // QUAD), per_row, QUAD, unit_bytes), np.uint8)
    out[..., unit:] = 0
    out[:full, :, :, :unit] = units[: full * QUAD].reshape(full, QUAD, per_row, unit).transpose(0, 2, 1, 3)
    if full < len(out):  # the last quad, filled up with zero rows
        out[full] = 0
        out[full, :, : n_rows - full * QUAD, :unit] = units[full * QUAD :].transpose(1, 0, 2)
    return out.reshape(-1)


# the legacy formats' block fields, (first byte, end) in a GGUF block: the quants, then the fields
# the grouped layout puts after them, in blocks_<fmt>.wgsl's order
GROUP_FIELDS = {
    GGMLQuantizationType.Q4_0: ((2, 18), (0, 2)),  # qs; d
    GGMLQuantizationType.Q4_1: ((4, 20), (0, 2), (2, 4)),  # qs; d, m
    GGMLQuantizationType.Q5_0: ((6, 22), (0, 2), (2, 6)),  # qs; d, qh
    GGMLQuantizationType.Q8_0: ((2, 34), (0, 2)),  # qs; d
}


def group_by_field(blocks: np.ndarray, n_rows: int, row_blocks: int, ggml_type: int, layout: RepackLayout):
    """Rows of GGUF blocks ([n_rows * row_blocks, block bytes]) in the grouped blocks layout: each row's
    blocks in groups of 8 (the last filled up with zero blocks), each group as its 8 blocks' quants,
    then each other field of the 8 blocks in turn. The same bytes, in whole texels."""
    per = layout.per_unit
    groups = -(-row_blocks // per)
    rows = np.zeros((n_rows, groups * per, blocks.shape[1]), np.uint8)
    rows[:, :row_blocks] = blocks.reshape(n_rows, row_blocks, -1)
    rows = rows.reshape(n_rows, groups, per, -1)
    fields = [rows[:, :, :, a:b].reshape(n_rows, groups, -1) for a, b in GROUP_FIELDS[GGMLQuantizationType(ggml_type)]]
    out = np.concatenate(fields, axis=2)
    assert out.shape[2] == layout.block_texels * SLOT_BYTES, (out.shape, layout)
    return out.reshape(-1)


def _gguf_window_rows(gpu: Any, row_bytes: int, window_bytes: int | None) -> int:
    """Rows per window of the GGUF bytes, as labkit.gpu.weights.upload_weight cuts them."""
    limit = gpu.max_binding if window_bytes is None else min(gpu.max_binding, int(window_bytes))
    return max(1, (limit - limit % 16) // row_bytes)


def _write_rows(gpu: Any, data: np.ndarray, texture: Any) -> None:
    """Bytes into a texture's first texels: whole texture rows, then what is left in the next."""
    row = SLOT_ROW * SLOT_BYTES
    full = data.size // row
    if full:
        layout = {"bytes_per_row": row, "rows_per_image": full}
        gpu.queue.write_texture({"texture": texture}, data[: full * row], layout, (SLOT_ROW, full, 1))
    tail = data[full * row :]
    if tail.size:
        origin = {"texture": texture, "origin": (0, full, 0)}
        gpu.queue.write_texture(origin, tail, {"bytes_per_row": row}, (tail.size // SLOT_BYTES, 1, 1))


def _padded(nbytes: int) -> int:
    """Bytes of a repacked window's texture: whole texture rows of SLOT_ROW slots."""
    row = SLOT_ROW * SLOT_BYTES
    return -(-nbytes // row) * row


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
