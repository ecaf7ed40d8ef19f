"""Operands read as textures: rows of a storage buffer copied into an rgba32float texture.

On lavapipe a kernel's storage-buffer load runs lane by lane, with a bounds check per lane
(about 1.1 GB/s on this kind of machine), while a textureLoad is gathered for all lanes at once
(7.7-8.4 GB/s). A kernel that reads each value of an operand many times (the tiled matmul's X,
attention's q, K and V) declares that operand `var NAME: texture_2d<f32>`; the op hands the
operand over as `Rows`, and the executor binds either the buffer or a texture filled from it
(labkit/ops/to_texture.wgsl), whichever the selected kernel declares. Activations stay in
storage buffers, which every other kernel and the captures read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import wgpu

from labkit.errors import GpuLimitError
from labkit.gpu.allocator import Allocator
from labkit.gpu.dispatch import Dispatch, grid
from labkit.gpu.plan_cache import pow2_at_most
from labkit.gpu.shader import compile_pipeline
from labkit.ops.attn_ctx.loop_turns import fused_tier_hint
from labkit.ops.base import Params, wgsl_file

TEXTURE_DIM = 8192  # WebGPU's guaranteed max-texture-dimension-2d (devices may give more)
FILL_PARAMS = Params(width="u32", rows="u32", offset="u32", stride="u32")
_TEXTURE_BINDING = re.compile(r"@binding\(\s*(\d+)\s*\)\s*var\s+\w+\s*:\s*texture_2d<f32>")


@dataclass(frozen=True)
class Rows:
    """`rows` rows of `width` floats in `buffer`, row t at float `offset + t * stride`. The
    buffer may be a (buffer, byte offset, byte size) binding, as for any operand."""

    buffer: Any
    offset: int
    stride: int
    width: int
    rows: int


@lru_cache(maxsize=256)
def texture_bindings(source: str) -> frozenset[int]:
    """The @binding numbers a kernel source declares as `texture_2d<f32>` (cached: asked per dispatch)."""
    return frozenset(int(m) for m in _TEXTURE_BINDING.findall(source))


@dataclass
class FillMemo:
    """A pass's last texture fill, kept while the stages that follow read the same input: q, k and v all
    read the attention norm's rows as their X, and fill one texture between them, not three. A stage whose
    first input is another clears it, so a buffer written since (a scratch region taken again) is never
    read through an old fill."""

    source: str | None = None  # the first input of the stages the fill serves
    key: tuple | None = None  # what was filled: the rows' buffer, offset, stride, width, count
    view: Any = None

    def stage(self, first_input: str | None) -> None:
        """A stage is planned: the fill serves it only if it reads the same first input."""
        if first_input != self.source:
            self.source, self.key, self.view = first_input, None, None


def _rows_key(rows: Rows) -> tuple:
    buf = rows.buffer
    at = (id(buf[0]), buf[1], buf[2]) if isinstance(buf, tuple) else (id(buf), 0, 0)
    return (*at, rows.offset, rows.stride, rows.width, rows.rows)


def fill_texture(objects: Allocator, rows: Rows, label: str, memo: FillMemo | None = None
                 ) -> tuple[Any, Dispatch | None]:  # fmt: skip
    """A texture view from `objects` holding `rows` (texel (w, t): floats 4w..4w+3 of row t), and the
    dispatch that fills it; None for the dispatch where `memo` holds a fill of the same rows."""
    if memo is not None and memo.key == _rows_key(rows):
        return memo.view, None
    view, fill = _fill(objects, rows, label)
    if memo is not None:
        memo.key, memo.view = _rows_key(rows), view
    return view, fill


def _fill(objects: Allocator, rows: Rows, label: str) -> tuple[Any, Dispatch]:
    gpu = objects.gpu
    if rows.width % 4 or rows.offset % 4 or rows.stride % 4:
        raise GpuLimitError(f"{label}: rows read as a texture need widths, offsets and strides in whole vec4s")
    dim = int(gpu.limits.get("max-texture-dimension-2d", TEXTURE_DIM))  # lavapipe 16384, NVIDIA 32768
    if rows.width // 4 > dim or rows.rows > dim:
        raise GpuLimitError(
            f"{label}: {rows.rows} rows of {rows.width} floats do not fit this device's {dim} x {dim} textures. "
            + fused_tier_hint(rows.rows, gpu.loop_turn_cap)
        )
    usage = wgpu.TextureUsage.STORAGE_BINDING | wgpu.TextureUsage.TEXTURE_BINDING
    # rows rounded up to a power of two, so a decode step's V, one row longer each step, reuses
    # its plan's texture for many steps (kernels read only the rows they were given)
    height = pow2_at_most(rows.rows, dim)
    view = objects.texture_view((rows.width // 4, height), wgpu.TextureFormat.rgba32float, usage, "operand texture")
    src = wgsl_file("to_texture")
    pipeline = compile_pipeline(gpu, src, label="to_texture")
    values = dict(width=rows.width, rows=rows.rows, offset=rows.offset, stride=rows.stride)
    bg = objects.bind(pipeline, [rows.buffer, view, objects.uniform(FILL_PARAMS.pack(src, values))])
    n_wg = -(-rows.rows * (rows.width // 4) // 64)
    return view, Dispatch(pipeline, bg, grid(n_wg, gpu.max_workgroups), f"to texture: {label}", filled=(rows, view))


def bind_operands(objects: Allocator, source: str, operands: list[Any], label: str, memo: FillMemo | None = None
                  ) -> tuple[list[Any], list[Dispatch]]:  # fmt: skip
    """What to bind for each operand (a `Rows` becomes its buffer, or a filled texture where
    `source` declares a texture), and the fills to dispatch first (none for rows `memo` holds filled)."""
    textures, bound, fills = texture_bindings(source), [], []
    for i, op in enumerate(operands):
        if not isinstance(op, Rows):
            bound.append(op)
        elif i in textures:
            view, fill = fill_texture(objects, op, f"{label} @binding({i})", memo)
            bound.append(view)
            fills += [fill] if fill is not None else []
        else:
            bound.append(op.buffer)
    return bound, fills
