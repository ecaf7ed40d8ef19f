"""Quantized matmul on the GPU: Y[t, n] = sum_k W[n, k] * X[t, k], W in its GGUF format.

A matmul kernel is composed from three kernel files of labkit/ops/ (see the top of
ops/matmul/matmul.wgsl for the driver interface): lib/common.wgsl + matmul/formats/quant_<fmt>.wgsl +
a driver. `prepare_matmul`
returns one `Dispatch` per weight window (and per token chunk when X or Y is bigger than one
storage binding), their uniforms, bind groups and X textures from the pass's allocator
(labkit.gpu.allocator); record them with `labkit.gpu.dispatch.encode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labkit.errors import GpuLimitError, UnsupportedTensorTypeError
from labkit.gpu.allocator import Allocator
from labkit.gpu.dispatch import Dispatch, grid, new_dispatch
from labkit.gpu.quant_table_buffer import tables_bind_group
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.texture import TEXTURE_DIM, FillMemo, Rows, fill_texture
from labkit.gpu.weights import GpuWeight
from labkit.ops.base import wgsl_const
from labkit.ops.matmul import DRIVERS, FORMATS, PARAMS, format_name, source

__all__ = ["FORMATS", "format_name", "matmul_source", "prepare_matmul", "token_chunks", "wgsl_const"]


def default_driver(gpu: Any | None = None) -> str:
    """The driver file for a source-less `prepare_matmul`: 'row' (one row per thread) on CPU adapters,
    'wg_reduce' on real GPUs, drivers that serve any token count (a lab's kernels choose their own)."""
    if gpu is None:
        from labkit.gpu.device import get_device

        gpu = get_device()
    return "row" if gpu.adapter_type == "CPU" else "wg_reduce"


def matmul_source(ggml_type: int, driver: str = "default", quant_variant: str = "default") -> str:
    """The composed WGSL: common + quant_<fmt>[_<quant_variant>] + the driver's file.

    driver: "default" (by adapter type), "row", "wg_reduce", or NAME for matmul_NAME.wgsl.
    """
    if driver == "default":
        driver = default_driver()
    drv = driver if driver in DRIVERS else f"matmul_{driver}"
    return source(format_name(ggml_type), drv, "" if quant_variant == "default" else quant_variant)


def driver_geometry(source: str) -> tuple[int, int]:
    """(ROWS_PER_WG, TOKENS_PER_WG) declared by a driver source (default 64, 8)."""
    return wgsl_const(source, "ROWS_PER_WG", 64), wgsl_const(source, "TOKENS_PER_WG", 8)


def _qk(source: str) -> int:
    return wgsl_const(source, "QK", 1)


OFFSET_ALIGN = 256  # WebGPU's default min-storage-buffer-offset-alignment (lavapipe: 32)


@dataclass(frozen=True)
class TokenChunk:
    """Tokens [t0, t0 + n) of a matmul, with X and Y bound as (buffer, byte offset, byte size) or whole.

    x_offset/y_offset are in floats, relative to the start of the binding."""

    t0: int
    n: int
    x: Any
    x_offset: int
    y: Any
    y_offset: int


def _fit(limit: int, rem: int, stride: int, width: int, n_max: int) -> int:
    """The most tokens t <= n_max whose span 4 * (rem + (t - 1) * stride + width) fits in limit bytes."""
    room = limit // 4 - rem - width
    if room < 0:
        return 0
    return n_max if stride <= 0 else min(n_max, room // stride + 1)


def token_chunks(
    T: int,
    x: Any,
    x_offset: int,
    x_stride: int,
    K: int,
    y: Any,
    y_offset: int,
    y_stride: int,
    N: int,
    limit: int,
    align: int = OFFSET_ALIGN,
    tile: int = 1,
) -> list[TokenChunk]:
    """Split T tokens so that every X and Y binding fits in `limit` bytes.

    A buffer no larger than the limit is bound whole (one chunk when both are). Otherwise each
    chunk binds the buffer from its first element's byte offset, aligned down to `align`,
    to its last element, and the remainder becomes the chunk's x_offset/y_offset."""
    if x.size <= limit and y.size <= limit:
        return [TokenChunk(0, T, x, x_offset, y, y_offset)]
    # even chunks, in whole token tiles where they fit: 128 tokens of Gemma's logits go as 64 + 64,
    # not 127 + 1 (a 1-token chunk runs a whole 16-token tile over all 262 144 rows)
    first = _fit(limit, align // 4 - 1, y_stride, N, T) if y.size > limit else T
    if x.size > limit:
        first = min(first, _fit(limit, align // 4 - 1, x_stride, K, T))
    target = T
    if first >= 1:
        per = -(-T // -(-T // first))
        target = min(first, -(-per // tile) * tile) if per >= tile else per
    out, t0 = [], 0
    while t0 < T:
        n = min(T - t0, target)
        xo, yo = x_offset + t0 * x_stride, y_offset + t0 * y_stride
        x_base = y_base = 0
        if x.size > limit:
            x_base = (4 * xo) // align * align
            n = _fit(limit, xo - x_base // 4, x_stride, K, n)
        if y.size > limit:
            y_base = (4 * yo) // align * align
            n = _fit(limit, yo - y_base // 4, y_stride, N, n)
        if n < 1:
            raise GpuLimitError(
                f"one token's X row ({4 * K} bytes) or Y row ({4 * N} bytes) does not fit a "
                f"{limit}-byte storage binding at a {align}-byte aligned offset"
            )
        xb = x if x.size <= limit else (x, x_base, 4 * (xo - x_base // 4 + (n - 1) * x_stride + K))
        yb = y if y.size <= limit else (y, y_base, 4 * (yo - y_base // 4 + (n - 1) * y_stride + N))
        out.append(TokenChunk(t0, n, xb, xo - x_base // 4, yb, yo - y_base // 4))
        t0 += n
    return out


X_TEXTURE = "var X: texture_2d<f32>"  # how a driver declares that it reads X from a texture
X_TEXTURE_TOKENS = TEXTURE_DIM  # tokens per X texture (its height)


def _split(c: TokenChunk, n_max: int, x_stride: int, y_stride: int) -> list[TokenChunk]:
    """A chunk cut into pieces of at most n_max tokens, binding the same buffers."""
    return [
        TokenChunk(c.t0 + s, min(n_max, c.n - s), c.x, c.x_offset + s * x_stride, c.y, c.y_offset + s * y_stride)
        for s in range(0, c.n, n_max)
    ]


def _x_textures(objects: Allocator, chunks: list[TokenChunk], K: int, x_stride: int, y_stride: int, name: str,
                memo: FillMemo | None = None):  # fmt: skip
    """The dispatches filling one X texture per chunk (cut to X_TEXTURE_TOKENS), and the chunks
    binding those textures as X. A chunk's X may be bound at a byte offset: so is its fill's."""
    fills, out = [], []
    for c in (piece for whole in chunks for piece in _split(whole, X_TEXTURE_TOKENS, x_stride, y_stride)):
        xt, fill = fill_texture(objects, Rows(c.x, c.x_offset, x_stride, K, c.n), f"{name} X[{c.t0}:]", memo)
        fills += [fill] if fill is not None else []  # none where the stage before filled the same rows
        out.append(TokenChunk(c.t0, c.n, xt, 0, c.y, c.y_offset))
    return fills, out


def _check_sizes(name: str, T: int, x: Any, x_floats: int, y: Any, y_floats: int) -> None:
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    for what, buf, n in (("X", x, x_floats), ("Y", y, y_floats)):
        if buf.size < 4 * n:
            raise ValueError(f"{name}: {what} buffer has {buf.size} bytes, {4 * n} needed")


def prepare_matmul(
    objects: Allocator,
    weight: GpuWeight,
    x: Any,
    y: Any,
    T: int,
    x_offset: int = 0,
    x_stride: int | None = None,
    y_offset: int = 0,
    y_stride: int | None = None,
    source: str | None = None,
    max_binding: int | None = None,
    window_filter: Callable[[int, int], bool] | None = None,
    epilogue: tuple[list, dict] | None = None,
    memo: FillMemo | None = None,
) -> list[Dispatch]:
    """Dispatches computing Y[y_offset + t*y_stride + n] for all rows n, t < T: one per weight
    window and token chunk.

    X and Y are bound whole when they fit in max-storage-buffer-binding-size (`max_binding`, at
    most the device's, lowers it: tests use it to force chunking). A bigger buffer (Gemma's logits
    are [T, 262144]: 1 MiB per token) is bound per chunk of tokens, at offsets aligned to
    max(256, min-storage-buffer-offset-alignment). `window_filter(index, count)` picks the weight
    windows that get dispatched (the lm_head variants); all by default. `epilogue` = (buffers bound
    after Params, their Params values): a fused kernel's extra operands (labkit.gpu.fusion). Uniforms,
    bind groups and X textures come from `objects` (the pass's allocator; `gpu.fresh` outside one);
    `memo`: the pass's last X fill, taken again where it holds these rows (labkit.gpu.texture.FillMemo)."""
    gpu = objects.gpu
    format_name(weight.ggml_type)  # UnsupportedTensorTypeError before any work
    K, N = weight.n_cols, weight.n_rows
    x_stride = K if x_stride is None else int(x_stride)
    y_stride = N if y_stride is None else int(y_stride)
    _check_sizes(weight.name, T, x, x_offset + (T - 1) * x_stride + K, y, y_offset + (T - 1) * y_stride + N)
    if source is None:
        source = matmul_source(weight.ggml_type)
    qk = _qk(source)
    if qk > 4 and K % qk:
        raise UnsupportedTensorTypeError(f"{weight.name}: K={K} is not a multiple of {qk}")
    limit = gpu.max_binding if max_binding is None else min(int(max_binding), gpu.max_binding)
    limit -= limit % 4
    align = max(OFFSET_ALIGN, int(gpu.limits.get("min-storage-buffer-offset-alignment", OFFSET_ALIGN)))
    if "X: array<vec4<f32>>" in source and (x_offset % 4 or x_stride % 4):
        raise ValueError(f"{weight.name}: this kernel reads X as vec4; x_offset {x_offset} and x_stride {x_stride} "
                         "must be multiples of 4")  # fmt: skip
    tokens_per_wg = driver_geometry(source)[1]
    try:
        chunks = token_chunks(T, x, x_offset, x_stride, K, y, y_offset, y_stride, N, limit, align, tokens_per_wg)
    except GpuLimitError as e:
        raise GpuLimitError(f"{weight.name}: {e}") from None
    keep = window_filter or (lambda index, count: True)
    windows = [w for i, w in enumerate(weight.windows) if keep(*weight.window_index(i))]
    fills = []
    if X_TEXTURE in source:  # the driver reads X from a texture: copy each chunk's tokens into one
        fills, chunks = _x_textures(objects, chunks, K, x_stride, y_stride, weight.name, memo)
    return fills + _dispatches(objects, weight, windows, chunks, source, (x_stride, y_stride), epilogue or ([], {}))


def _dispatches(
    objects: Allocator, weight: GpuWeight, windows, chunks, source: str, strides, epilogue
) -> list[Dispatch]:
    """One dispatch per weight window and token chunk."""
    gpu = objects.gpu
    pipeline = compile_pipeline(gpu, source, label=f"matmul_{format_name(weight.ggml_type)}")
    rows_per_wg, tokens_per_wg = driver_geometry(source)
    (x_stride, y_stride), (extra, extra_values) = strides, epilogue
    tables, out = tables_bind_group(gpu, pipeline, source), []
    for w in windows:
        for c in chunks:
            values = dict(K=weight.n_cols, rows=w.n_rows, T=c.n, row0=w.first_row, x_offset=c.x_offset,
                          x_stride=x_stride, y_offset=c.y_offset, y_stride=y_stride, **extra_values)  # fmt: skip
            n_wg = -(-w.n_rows // rows_per_wg) * -(-c.n // tokens_per_wg)
            label = f"matmul {weight.name}[{w.first_row}:{w.first_row + w.n_rows}] T={sum(c.n for c in chunks)}"
            label += f" tokens[{c.t0}:{c.t0 + c.n}]" if len(chunks) > 1 else ""
            buffers, data = [w.buffer, c.x, c.y], PARAMS.pack(source, values)
            n = grid(n_wg, gpu.max_workgroups)
            out.append(new_dispatch(objects, pipeline, buffers, data, n, label, tables, tuple(extra)))
    return out
