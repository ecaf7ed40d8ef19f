"""GPU core and quantized matmul kernels, on the real wgpu device, against numpy.

Every format gets fresh random GGUF bytes (a fresh entropy seed per session, SEED below, plus a
per-case offset; the seed is in every failure message;
f16 scale fields are random finite halves) and random activations. The GPU result is
compared with (a) gguf.quants.dequantize(raw) @ x in float64, the independent oracle, and
(b) labkit.model.dequant.dequantize(raw) @ x (gguf.quants behind labkit's byte checks and row chunks).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import wgpu
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from labkit.errors import ShaderCompileError, UnsupportedTensorTypeError
from labkit.gpu.allocator import FreshObjects
from labkit.gpu.device import GpuDevice, describe, get_device, pick_adapter
from labkit.gpu.dispatch import Dispatch, encode, grid, uniform
from labkit.gpu.matmul import driver_geometry, matmul_source, prepare_matmul
from labkit.gpu.repack import (
    GROUP_FIELDS,
    REPACK_BUFFER,
    WINDOW_ROWS,
    layout_of,
    repack_weight,
    repacked_bytes,
    upload_blocks,
    window_rows,
)
from labkit.gpu.shader import compile_pipeline, compose, load_kernel
from labkit.gpu.weights import upload_weight
from labkit.ops.base import PassShape, wgsl_const
from labkit.ops.glu import ACT_CODES, ACTIVATIONS
from labkit.ops.matmul import (
    BLOCK_FORMATS,
    EPILOGUE_PARAMS,
    INTEGER_FORMATS,
    _repacked_source,
    epilogue_source,
    format_name,
    repacked_source,
)
from labkit.ops.matmul import source as mm_source
from labkit.ops.matmul.table import MATVEC_MAX_T, SPLITK_FORMATS
from labkit.ops.registry import get_kernel
from labkit.quant.formats import FORMATS_LIST, QUANT_FORMATS

try:
    from labkit.model.dequant import dequantize as labkit_dequantize
except ImportError:  # written by someone else; skip that half of the check until it exists
    labkit_dequantize = None

Q = GGMLQuantizationType
SEED = int(np.random.SeedSequence().entropy % 2**32)  # fresh per session; in every failure message
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC

FORMATS = [f.qtype for f in FORMATS_LIST]  # every GGUF type labkit reads (quant/formats.py)


@pytest.fixture(scope="module")
def gpu() -> GpuDevice:
    return get_device()


def random_halves(rng: np.random.Generator, n: int, scale: float = 0.05) -> np.ndarray:
    """n random finite, non-zero halves (as float16)."""
    v = rng.uniform(0.25, 1.0, n) * rng.choice([-1.0, 1.0], n) * scale
    return v.astype(np.float16)


def random_weight(rng: np.random.Generator, qtype: Q, n_rows: int, n_cols: int) -> np.ndarray:
    """Fresh random valid GGUF bytes for a [n_rows, n_cols] tensor, flat uint8 (the format record's
    writer: random quants, finite scales)."""
    fmt = QUANT_FORMATS[qtype]
    return fmt.random_blocks(rng, n_rows * n_cols // fmt.block_size, 1.0 if fmt.kind == "float" else 0.05).reshape(-1)


def oracles(raw: np.ndarray, qtype: Q, n_rows: int, n_cols: int) -> list[tuple[str, np.ndarray]]:
    """[(name, dequantized float64 [n_rows, n_cols])] from the available implementations."""
    rows = raw.reshape(n_rows, -1)
    out = [("gguf", gguf_dequantize(rows, qtype).astype(np.float64).reshape(n_rows, n_cols))]
    if labkit_dequantize is not None:
        try:
            w = labkit_dequantize(raw, int(qtype), (n_rows, n_cols))
        except UnsupportedTensorTypeError:
            pass
        else:
            out.append(("labkit.model.dequant", np.asarray(w, dtype=np.float64)))
    return out


def storage(gpu, data: np.ndarray) -> object:
    data = np.ascontiguousarray(data, dtype=np.float32)
    nbytes = max(16, -(-data.nbytes // 16) * 16)
    buf = gpu.device.create_buffer(size=nbytes, usage=STORAGE)
    if data.nbytes:
        gpu.queue.write_buffer(buf, 0, data)
    return buf


def read_f32(gpu, buf) -> np.ndarray:
    return np.frombuffer(gpu.queue.read_buffer(buf), dtype=np.float32).copy()


def submit(gpu, dispatches: list[Dispatch]) -> None:
    enc = gpu.device.create_command_encoder()
    encode(enc, dispatches)
    gpu.queue.submit([enc.finish()])


def check_close(got: np.ndarray, want: np.ndarray, what: str, nmse_max: float) -> None:
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    diff = got.astype(np.float64) - want
    nmse = float(np.sum(diff**2) / max(np.sum(want**2), 1e-300))
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    tol = 1e-4 * max(1.0, float(np.max(np.abs(want))))
    assert nmse <= nmse_max, f"{what}: nmse {nmse:.3g} > {nmse_max:g} (max |diff| {max_abs:.3g})"
    assert max_abs <= tol, f"{what}: max |diff| {max_abs:.3g} > {tol:.3g} (nmse {nmse:.3g})"


def run_case(
    gpu,
    qtype: Q,
    n_rows: int,
    n_cols: int,
    T: int,
    seed: int,
    driver: str,
    window_rows: int | None = None,
    offsets: bool = False,
    repack_binding: int | None = None,
) -> None:
    rng = np.random.default_rng(seed)
    raw = random_weight(rng, qtype, n_rows, n_cols)
    rb = raw.nbytes // n_rows
    what = f"{qtype.name} {n_rows}x{n_cols} T={T} driver={driver} seed={seed} windows={window_rows} offsets={offsets}"
    mwb = None if window_rows is None else window_rows * rb + 15
    weight = upload_weight(gpu, "w", raw, int(qtype), n_rows, n_cols, max_window_bytes=mwb)
    if window_rows is not None:
        assert len(weight.windows) == -(-n_rows // window_rows), what
    repacked = driver in ("tiled", "matvec", "matvec4", "blocks_tiled", "blocks_matvec", "blocks_splitk")
    # the repacked drivers read X as vec4: X offsets stay multiples of 4 (Y's need not)
    x_off, x_stride = ((8, n_cols + 4) if repacked else (5, n_cols + 3)) if offsets else (0, n_cols)
    y_off, y_stride = (7, n_rows + 2) if offsets else (0, n_rows)
    x = rng.standard_normal(x_off + T * x_stride).astype(np.float32)
    sentinel = np.float32(-12345.0)
    y0 = np.full(y_off + T * y_stride + 3, sentinel, dtype=np.float32)
    xb, yb = storage(gpu, x), storage(gpu, y0)
    if driver.startswith("blocks_"):  # the GGUF blocks in texels, the format's own drivers
        variant = "blocks_splitk" if driver == "blocks_splitk" else "blocks"
        kernel = get_kernel(f"matmul_{format_name(int(qtype))}", variant, "cpu")
        layout = layout_of(kernel.repack())
        if layout.per_unit > 1:  # grouped by field: written from the host, as the weight store does
            weight = upload_blocks(gpu, "w", raw, int(qtype), n_rows, n_cols, layout, repack_binding, mwb)
        else:
            weight = repack_weight(gpu, weight, kernel.repack(), max_binding=repack_binding)
        src = kernel.source(PassShape(16 if driver == "blocks_tiled" else 1, 0))
    elif repacked:
        fmt = format_name(int(qtype))
        weight = repack_weight(gpu, weight, mm_source(fmt, "repack"), max_binding=repack_binding)
        src = (
            _repacked_source(fmt, driver)
            if driver == "matvec4"
            else repacked_source(fmt, 1 if driver == "matvec" else 16)
        )
    else:
        src = matmul_source(int(qtype), driver=driver)
    submit(gpu, prepare_matmul(gpu.fresh, weight, xb, yb, T, x_off, x_stride, y_off, y_stride, src))
    check_strided_output(
        gpu, yb, y0, sentinel, x, raw, qtype, (n_rows, n_cols, T), (x_off, x_stride, y_off, y_stride), what
    )


def check_strided_output(gpu, yb, y0, sentinel, x, raw, qtype, dims, strides, what: str) -> None:
    """Y's T strided rows equal X·Wᵀ for both dequantization oracles; nothing else in Y was written."""
    n_rows, n_cols, T = dims
    x_off, x_stride, y_off, y_stride = strides
    y = read_f32(gpu, yb)[: y0.size]
    xs = np.stack([x[x_off + t * x_stride : x_off + t * x_stride + n_cols] for t in range(T)])
    got = np.stack([y[y_off + t * y_stride : y_off + t * y_stride + n_rows] for t in range(T)])
    mask = np.ones(y0.size, bool)
    for t in range(T):
        mask[y_off + t * y_stride : y_off + t * y_stride + n_rows] = False
    assert np.all(y[mask] == sentinel), f"{what}: wrote outside its output"
    for name, w in oracles(raw, qtype, n_rows, n_cols):
        check_close(got, xs.astype(np.float64) @ w.T, f"{what} vs {name}", 1e-9)


def shape_for(qtype: Q) -> tuple[int, int]:
    """Odd rows (>64, so 2 row groups); K an odd number of blocks and not a multiple of 64,
    so odd rows of Q8_0/Q4_0/Q5_0/Q6_K/F16 start only 2-byte aligned."""
    block = GGML_QUANT_SIZES[qtype][0]
    if block == 1:
        return 67, 101
    if block == 32:
        return 67, 96
    return 67, 768


@pytest.mark.parametrize("driver", ["row", "wg_reduce", "wg_tile"])
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_matmul_format(gpu, qtype, driver):
    n_rows, n_cols = shape_for(qtype)
    seed = SEED + 1000 * int(qtype) + {"row": 7, "wg_reduce": 11, "wg_tile": 13}[driver]
    # T at the tile edges; windows of 5 rows (row0 offsets); strided, offset X and Y
    run_case(gpu, qtype, n_rows, n_cols, 1, seed, driver)
    run_case(gpu, qtype, n_rows, n_cols, 3, seed + 1, driver, window_rows=5, offsets=True)
    run_case(gpu, qtype, n_rows, n_cols, 8, seed + 2, driver)
    run_case(gpu, qtype, n_rows, n_cols, 9, seed + 3, driver, window_rows=13, offsets=True)
    if driver == "wg_tile":  # past one 64-token tile, and past one 64-row tile within a window
        run_case(gpu, qtype, n_rows, n_cols, 70, seed + 4, driver, window_rows=66, offsets=True)


INTEGER_TYPES = [q for q in FORMATS if format_name(int(q)) in INTEGER_FORMATS]


@pytest.mark.parametrize("qtype", INTEGER_TYPES, ids=lambda q: q.name)
def test_repacked_matmul_format(gpu, qtype):
    """The default kernels: the weight repacked on the GPU from its GGUF bytes (each format's
    parts4 reader), then the decode (matvec) and prefill (tiled) drivers, against gguf.quants.
    T at the 16-token tile's edges, rows past a 4-row quad and a 128-row group, windows of 5 and
    13 GGUF rows re-cut by a small binding limit, strided and offset X and Y."""
    n_rows, n_cols = shape_for(qtype)
    seed = SEED + 3000 + 10 * int(qtype)
    run_case(gpu, qtype, n_rows, n_cols, 1, seed, "matvec")
    run_case(gpu, qtype, n_rows, n_cols, 2, seed + 1, "matvec", window_rows=5, offsets=True)  # T > 1 works too
    run_case(gpu, qtype, n_rows, n_cols, 2, seed + 2, "tiled", window_rows=13, offsets=True)
    run_case(gpu, qtype, n_rows, n_cols, 16, seed + 3, "tiled")
    run_case(gpu, qtype, n_rows, n_cols, 17, seed + 4, "tiled", offsets=True)
    limit = repacked_bytes(8, n_cols, 16)  # at most 8 rows per repacked window: many re-cut windows
    run_case(gpu, qtype, n_rows, n_cols, 5, seed + 5, "tiled", window_rows=13, repack_binding=limit)
    run_case(gpu, qtype, n_rows, n_cols, 1, seed + 6, "matvec", window_rows=13, repack_binding=limit)
    # a few tokens at once (a batch's decode step): one token group cut short, and a second group cut short
    run_case(gpu, qtype, n_rows, n_cols, 3, seed + 7, "matvec4", window_rows=5, offsets=True)
    run_case(gpu, qtype, n_rows, n_cols, 6, seed + 8, "matvec4")


BLOCK_TYPES = [q for q in FORMATS if format_name(int(q)) in BLOCK_FORMATS]


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_blocks_matmul_format(gpu, qtype):
    """The blocks layout: GGUF blocks padded to whole texels on the GPU, read by the format's own
    decode and prefill drivers, against gguf.quants. Odd rows past a quad and a 128-row group,
    T at the tile edges, K of 3 blocks, re-cut windows, strided and offset X and Y."""
    n_rows, n_cols = shape_for(qtype)
    seed = SEED + 3500 + 10 * int(qtype)
    run_case(gpu, qtype, n_rows, n_cols, 1, seed, "blocks_matvec")
    run_case(gpu, qtype, n_rows, n_cols, 1, seed + 1, "blocks_matvec", window_rows=5, offsets=True)
    run_case(gpu, qtype, n_rows, n_cols, 2, seed + 2, "blocks_tiled", window_rows=13, offsets=True)
    run_case(gpu, qtype, n_rows, n_cols, 16, seed + 3, "blocks_tiled")
    run_case(gpu, qtype, n_rows, n_cols, 17, seed + 4, "blocks_tiled", offsets=True)
    run_case(gpu, qtype, 1031, 256, 33, seed + 5, "blocks_tiled")
    run_case(gpu, qtype, 1031, 512, 1, seed + 6, "blocks_matvec", offsets=True)
    kernel = get_kernel(f"matmul_{format_name(int(qtype))}", "blocks", "cpu")
    limit = 8 * layout_of(kernel.repack()).row_bytes(n_cols)  # 8 rows a window
    run_case(gpu, qtype, n_rows, n_cols, 5, seed + 7, "blocks_tiled", window_rows=13, repack_binding=limit)
    run_case(gpu, qtype, n_rows, n_cols, 1, seed + 8, "blocks_matvec", window_rows=13, repack_binding=limit)
    # a prompt of up to MATVEC_MAX_T tokens runs the decode driver, a pass per token
    run_case(gpu, qtype, n_rows, n_cols, MATVEC_MAX_T, seed + 11, "blocks_matvec", window_rows=13, offsets=True)
    if qtype in GROUP_FIELDS:  # a whole group of 8 blocks and a partial one (Qwen2.5-0.5B's 896 is 28 blocks)
        run_case(gpu, qtype, 131, 352, 3, seed + 9, "blocks_tiled", offsets=True)
        run_case(gpu, qtype, 131, 896, 1, seed + 10, "blocks_matvec", window_rows=40, offsets=True)


SPLITK_TYPES = [q for q in FORMATS if format_name(int(q)) in SPLITK_FORMATS]


@pytest.mark.parametrize("qtype", SPLITK_TYPES, ids=lambda q: q.name)
def test_blocks_splitk_matvec_format(gpu, qtype):
    """The split-K decode driver (64 threads share 4 rows: a real GPU's default): odd rows past a
    quad, K of 3 blocks (fewer parts than threads) and of 57 (more: each thread takes several, the
    last round partial), re-cut windows, strided and offset X and Y, against gguf.quants."""
    n_rows, n_cols = shape_for(qtype)
    seed = SEED + 3700 + 10 * int(qtype)
    run_case(gpu, qtype, n_rows, n_cols, 1, seed, "blocks_splitk")
    run_case(gpu, qtype, n_rows, n_cols, 1, seed + 1, "blocks_splitk", window_rows=5, offsets=True)
    run_case(gpu, qtype, 131, 57 * 256, 1, seed + 2, "blocks_splitk", offsets=True)
    kernel = get_kernel(f"matmul_{format_name(int(qtype))}", "blocks_splitk", "cpu")
    limit = 8 * layout_of(kernel.repack()).row_bytes(n_cols)  # 8 rows a window
    run_case(gpu, qtype, n_rows, n_cols, 1, seed + 3, "blocks_splitk", window_rows=13, repack_binding=limit)
    run_case(gpu, qtype, n_rows, n_cols, MATVEC_MAX_T, seed + 4, "blocks_splitk", offsets=True)  # a short prompt


@pytest.mark.parametrize("qtype", [q for q in BLOCK_TYPES if q not in GROUP_FIELDS], ids=lambda q: q.name)
def test_blocks_from_the_host_equal_the_gpu_repack(gpu, qtype):
    """The weight store writes the blocks layout from the mapped file (upload_blocks); the GPU
    repack kernel writes it from uploaded bytes. Same windows (cut inside the GGUF windows, so the
    lm_head policy leaves out the same rows), and the drivers give bit-identical rows on both."""
    rng = np.random.default_rng(SEED + 3600 + int(qtype))
    n_rows, n_cols = 75, 512
    raw = random_weight(rng, qtype, n_rows, n_cols)
    rb = raw.nbytes // n_rows
    kernel = get_kernel(f"matmul_{format_name(int(qtype))}", "blocks", "cpu")
    layout = layout_of(kernel.repack())
    limit = 8 * layout.row_bytes(n_cols)  # 8 rows a texture window
    uploaded = upload_weight(gpu, "w", raw, int(qtype), n_rows, n_cols, max_window_bytes=30 * rb + 15)
    on_gpu = repack_weight(gpu, uploaded, kernel.repack(), max_binding=limit)
    on_host = upload_blocks(gpu, "w", raw, int(qtype), n_rows, n_cols, layout, limit, 30 * rb + 15)
    cuts = [(w.first_row, w.n_rows, w.part_of) for w in on_gpu.windows]
    assert cuts == [(w.first_row, w.n_rows, w.part_of) for w in on_host.windows]
    assert cuts[3:5] == [(24, 6, 0), (30, 8, 1)] and on_host.source_windows == on_gpu.source_windows == 3
    for T in (1, 5):
        x = storage(gpu, rng.standard_normal(T * n_cols).astype(np.float32))
        ys = []
        for w in (on_gpu, on_host):
            y = storage(gpu, np.zeros(T * n_rows, np.float32))
            submit(gpu, prepare_matmul(gpu.fresh, w, x, y, T, source=kernel.source(PassShape(T, 0))))
            ys.append(read_f32(gpu, y))
        assert ys[0].tobytes() == ys[1].tobytes(), f"{qtype.name} T={T} seed={SEED + 3600}"


TEXTURE_READER = """
@group(0) @binding(0) var W: texture_2d<u32>;
@group(0) @binding(1) var<storage, read_write> Out: array<vec4<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let width = textureDimensions(W).x;
    Out[g.x] = textureLoad(W, vec2<u32>(g.x % width, g.x / width), 0);
}
"""


def texture_bytes(gpu, view) -> np.ndarray:
    """A weight window's texture read back whole, through textureLoad (weight textures have no copy-out usage)."""
    width, height = view.texture.size[0], view.texture.size[1]
    out = storage(gpu, np.zeros(4 * width * height, np.uint32))
    pipeline = compile_pipeline(gpu, TEXTURE_READER, label="read texture")
    submit(gpu, [Dispatch(pipeline, gpu.fresh.bind(pipeline, [view, out]), grid(width * height // 64), "read texture")])
    return np.frombuffer(gpu.queue.read_buffer(out), np.uint8)


def test_repacked_windows_are_whole_workgroups():
    """Every driver on repacked weights covers a divisor of WINDOW_ROWS rows a workgroup, and windows
    take WINDOW_ROWS at a time where they fit (else quads): only a weight's last window leaves a
    workgroup computing rows past its end."""
    sources = [repacked_source(fmt, T) for fmt in INTEGER_FORMATS for T in (1, 64)]
    for fmt in BLOCK_FORMATS:
        kernel = get_kernel(f"matmul_{fmt}", "blocks", "cpu")
        sources += [kernel.source(PassShape(T, 0)) for T in (1, 64)]
    for src in sources:
        rows_per_wg = driver_geometry(src)[0]
        assert WINDOW_ROWS % rows_per_wg == 0, (rows_per_wg, src[:200])
    layout = layout_of(get_kernel("matmul_q6_k", "blocks", "cpu").repack())
    K = 14336  # Llama-3.1-8B's ffn_down: 12544 bytes a row
    rows = window_rows(layout, K, 1 << 27)
    assert rows == 1280, rows  # 1337 rows fit 16 MiB
    assert layout.window_bytes(rows, K) <= REPACK_BUFFER < layout.window_bytes(rows + WINDOW_ROWS, K)
    small = layout.window_bytes(12, K)  # a binding that holds 12 rows: quads, not WINDOW_ROWS
    assert window_rows(layout, K, small) == 12


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q4_K], ids=lambda q: q.name)
def test_blocks_layout_puts_a_quads_rows_side_by_side(gpu, qtype):
    """Block k of rows 4q .. 4q + 3 is one run of 4 padded blocks (blocks_quads.wgsl), and the
    window's last quad is filled up with zero rows: 7 rows of 3 blocks, read back from the texture
    the host writes (upload_blocks) and the one the GPU repack writes."""
    rng = np.random.default_rng(SEED + 3700)
    n_rows, blocks = 7, 3
    raw = random_weight(rng, qtype, n_rows, 256 * blocks)
    size = GGML_QUANT_SIZES[qtype][1]
    unit = -(-size // 16) * 16  # a block padded to whole texels
    want = np.zeros(8 * blocks * unit, np.uint8)  # 2 quads
    for q in range(2):
        for k in range(blocks):
            for j in range(4):
                if 4 * q + j < n_rows:
                    at = ((q * blocks + k) * 4 + j) * unit
                    want[at : at + size] = raw.reshape(n_rows, blocks, size)[4 * q + j, k]
    kernel = get_kernel(f"matmul_{format_name(int(qtype))}", "blocks", "cpu")
    layout = layout_of(kernel.repack())
    on_host = upload_blocks(gpu, "w", raw, int(qtype), n_rows, 256 * blocks, layout)
    on_gpu = repack_weight(gpu, upload_weight(gpu, "w", raw, int(qtype), n_rows, 256 * blocks), kernel.repack())
    for weight in (on_host, on_gpu):
        assert len(weight.windows) == 1
        got = texture_bytes(gpu, weight.windows[0].buffer)
        assert np.array_equal(got[: want.size], want), np.flatnonzero(got[: want.size] != want)[:8]
        assert not got[want.size :].any()  # the texture row's rest stays zero


def test_repacked_matmul_row_groups(gpu):
    """1031 rows: eight full 128-row groups of the tiled driver plus a 7-row remainder (a partial
    quad), and 1031 = 4 x 257 + 3 for the matvec driver; 33 tokens = two full tiles and one token."""
    assert wgsl_const(repacked_source("q8_0", 33), "ROWS_PER_WG", 0) == 128
    for i, (driver, T) in enumerate([("tiled", 33), ("matvec", 2)]):
        run_case(gpu, Q.Q8_0, 1031, 64, T, SEED + 3100 + i, driver, offsets=True)
    run_case(gpu, Q.Q6_K, 1031, 256, 18, SEED + 3110, "tiled")


def test_tiled_x_texture_split_into_pieces(gpu, monkeypatch):
    """The tiled driver reads X from textures of at most X_TEXTURE_TOKENS tokens: with the limit
    lowered to 5, 37 offset, strided tokens go as 8 textures (pieces of 5 and one of 2, each
    filled by its own dispatch), and every row still equals gguf's."""
    import labkit.gpu.matmul as mm

    monkeypatch.setattr(mm, "X_TEXTURE_TOKENS", 5)
    run_case(gpu, Q.Q8_0, 67, 96, 37, SEED + 3200, "tiled", offsets=True)
    rw = repack_weight(
        gpu,
        upload_weight(gpu, "w", random_weight(np.random.default_rng(1), Q.Q8_0, 8, 64), int(Q.Q8_0), 8, 64),
        mm_source("q8_0", "repack"),
    )
    x, y = storage(gpu, np.ones(37 * 64, np.float32)), storage(gpu, np.zeros(37 * 8, np.float32))
    fills = [
        d
        for d in prepare_matmul(gpu.fresh, rw, x, y, 37, source=repacked_source("q8_0", 37))
        if d.label.startswith("to texture")
    ]
    assert len(fills) == 8


def test_repacked_windows_keep_their_gguf_window(gpu):
    """Re-cut windows remember the GGUF window they came from, so the lm_head policy that leaves
    out the last window (002) leaves out the same rows on either layout."""
    rng = np.random.default_rng(SEED + 3200)
    n_rows, n_cols = 40, 64
    raw = random_weight(rng, Q.Q8_0, n_rows, n_cols)
    weight = upload_weight(
        gpu, "w", raw, int(Q.Q8_0), n_rows, n_cols, max_window_bytes=25 * (raw.nbytes // n_rows) + 15
    )
    assert [(w.first_row, w.n_rows) for w in weight.windows] == [(0, 25), (25, 15)]
    rw = repack_weight(gpu, weight, mm_source("q8_0", "repack"), max_binding=repacked_bytes(8, n_cols, 32))
    assert [(w.first_row, w.n_rows, w.part_of) for w in rw.windows] == [
        (0, 8, 0), (8, 8, 0), (16, 8, 0), (24, 1, 0), (25, 8, 1), (33, 7, 1)]  # fmt: skip
    keep_all_but_last = lambda index, count: index < count - 1  # noqa: E731
    for w, src in ((weight, matmul_source(int(Q.Q8_0), "row")), (rw, repacked_source("q8_0", 1))):
        x = rng.standard_normal(n_cols).astype(np.float32)
        sentinel = np.float32(-777.0)
        xb, yb = storage(gpu, x), storage(gpu, np.full(n_rows, sentinel, np.float32))
        submit(gpu, prepare_matmul(gpu.fresh, w, xb, yb, 1, source=src, window_filter=keep_all_but_last))
        y = read_f32(gpu, yb)[:n_rows]
        assert np.all(y[25:] == sentinel) and not np.any(y[:25] == sentinel), f"{w.name}: {y}"


def test_repacked_carries_the_format_fault(gpu):
    """Q4_K mins added: the repack composes the faulty reader, so the fast drivers give what the
    raw-bytes row driver gives with the same reader, and not what gguf.quants gives."""
    rng = np.random.default_rng(SEED + 3300)
    n_rows, n_cols, T = 37, 512, 5
    raw = random_weight(rng, Q.Q4_K, n_rows, n_cols)
    weight = upload_weight(gpu, "w", raw, int(Q.Q4_K), n_rows, n_cols)
    rw = repack_weight(gpu, weight, mm_source("q4_k", "repack", "mins_added"))
    x = rng.standard_normal((T, n_cols)).astype(np.float32)
    out = {}
    for name, w, src in (
        ("row", weight, mm_source("q4_k", "row", "mins_added")),
        ("tiled", rw, repacked_source("q4_k", T)),
        ("matvec", rw, repacked_source("q4_k", 1)),
    ):
        xb, yb = storage(gpu, x), storage(gpu, np.zeros((T, n_rows), np.float32))
        submit(gpu, prepare_matmul(gpu.fresh, w, xb, yb, T, source=src))
        out[name] = read_f32(gpu, yb)[: T * n_rows].reshape(T, n_rows)
    good = x.astype(np.float64) @ gguf_dequantize(raw.reshape(n_rows, -1), Q.Q4_K).astype(np.float64).T
    for name in ("tiled", "matvec"):
        check_close(out[name], out["row"].astype(np.float64), f"mins_added {name} vs row seed={SEED + 3300}", 1e-9)
    nmse = float(np.sum((out["row"] - good) ** 2) / np.sum(good**2))
    assert nmse > 1e-2, f"the fault should show: nmse {nmse:.3g} against gguf.quants"


def test_repack_refuses_float_weights(gpu):
    raw = random_weight(np.random.default_rng(SEED), Q.F32, 4, 32)
    weight = upload_weight(gpu, "w", raw, int(Q.F32), 4, 32)
    with pytest.raises(UnsupportedTensorTypeError, match="no repacked layout"):
        repack_weight(gpu, weight, mm_source("f32", "repack"))


def test_matmul_odd_row_bytes_alignment(gpu):
    """One-block rows: Q8_0/Q4_0/Q5_0 rows at every 2-byte phase; K = 1 for F32/F16 tails."""
    for i, qtype in enumerate([Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q6_K]):
        block = GGML_QUANT_SIZES[qtype][0]
        T = 6 if i % 2 else 2  # 6: the tile's tokens 4..7 branch with a clamped token
        run_case(gpu, qtype, 9, block, T, SEED + 77 + i, "row", window_rows=3, offsets=True)
    run_case(gpu, Q.F32, 5, 1, 3, SEED + 90, "row")
    run_case(gpu, Q.F16, 7, 3, 9, SEED + 91, "wg_reduce", offsets=True)


def test_grid():
    assert grid(1) == (1, 1, 1)
    assert grid(65535) == (65535, 1, 1)
    x, y, z = grid(65536)
    assert z == 1 and y == 2 and x * y >= 65536 and x <= 65535
    for n in (65536, 131071, 131070, 200000, 65535 * 65535):
        x, y, z = grid(n)
        assert x <= 65535 and y <= 65535 and x * y >= n and (x - 1) * y < n, n
    assert grid(10, max_dim=4) == (4, 3, 1)
    with pytest.raises(ValueError):
        grid(65535 * 65535 + 1)


def test_matmul_2d_grid(gpu):
    """More than 65 535 workgroups: the linear id spans wid.y, and stray ids return."""
    seed = SEED + 5
    rng = np.random.default_rng(seed)
    # wg_reduce: one workgroup per row; 70 001 rows of K=4 F32
    n_rows, n_cols = 70_001, 4
    raw = rng.standard_normal(n_rows * n_cols).astype(np.float32).view(np.uint8)
    weight = upload_weight(gpu, "tall", raw, int(Q.F32), n_rows, n_cols)
    x = rng.standard_normal(n_cols).astype(np.float32)
    xb, yb = storage(gpu, x), storage(gpu, np.full(n_rows, np.nan, np.float32))
    src = matmul_source(int(Q.F32), driver="wg_reduce")
    ds = prepare_matmul(gpu.fresh, weight, xb, yb, 1, source=src)
    assert ds[0].workgroups[1] == 2
    submit(gpu, ds)
    want = raw.view(np.float32).reshape(n_rows, n_cols).astype(np.float64) @ x
    check_close(read_f32(gpu, yb)[:n_rows], want, f"2-D grid wg_reduce seed={seed}", 1e-12)
    # row-per-thread driver: 256 rows per workgroup, 8 tokens per tile; 3 rows and
    # 65 536 token tiles (T = 524 281, K = 1) need a 2-D grid
    n_rows, T = 3, 8 * 65_535 + 1
    w3 = rng.standard_normal(n_rows).astype(np.float32)
    weight = upload_weight(gpu, "tall1", w3.view(np.uint8), int(Q.F32), n_rows, 1)
    x = rng.standard_normal(T).astype(np.float32)
    xb, yb = storage(gpu, x), storage(gpu, np.full(T * n_rows, np.nan, np.float32))
    src = matmul_source(int(Q.F32), driver="row")
    ds = prepare_matmul(gpu.fresh, weight, xb, yb, T, x_stride=1, source=src)
    assert ds[0].workgroups[1] == 2
    submit(gpu, ds)
    got = read_f32(gpu, yb)[: T * n_rows].reshape(T, n_rows)
    assert np.array_equal(got, x[:, None] * w3[None, :]), f"2-D grid row driver seed={seed}"


def test_upload_windows(gpu, tmp_path):
    """Windows split by rows, each buffer padded to 16 and within the limit; bytes unchanged;
    a read-only memmap source works."""
    seed = SEED + 3
    rng = np.random.default_rng(seed)
    n_rows, n_cols = 23, 64
    raw = random_weight(rng, Q.Q8_0, n_rows, n_cols)  # 68-byte rows
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    w = upload_weight(gpu, "w", mm, int(Q.Q8_0), n_rows, n_cols, max_window_bytes=300)
    assert w.row_bytes == 68 and [x.n_rows for x in w.windows] == [4] * 5 + [3], f"seed={seed}"
    assert [x.first_row for x in w.windows] == [0, 4, 8, 12, 16, 20], f"seed={seed}"
    got = b""
    for win in w.windows:
        assert win.buffer.size % 16 == 0 and win.buffer.size <= 300, f"seed={seed}"
        got += bytes(gpu.queue.read_buffer(win.buffer))[: win.n_rows * 68]
    assert got == raw.tobytes(), f"uploaded bytes differ (seed={seed})"
    with pytest.raises(ValueError):
        upload_weight(gpu, "w", raw[:-2], int(Q.Q8_0), n_rows, n_cols)


def test_unsupported_type(gpu):
    """Q8_K is ggml's internal activation type: no file stores weights in it, gguf.quants does not
    dequantize it, so labkit has no record and no kernel for it."""
    with pytest.raises(UnsupportedTensorTypeError):
        matmul_source(int(Q.Q8_K))
    with pytest.raises(UnsupportedTensorTypeError):
        upload_weight(gpu, "w", np.zeros(292, np.uint8), int(Q.Q8_K), 1, 256)
    w = upload_weight(gpu, "w", np.zeros(84, np.uint8), int(Q.Q2_K), 1, 256)
    w.ggml_type = int(Q.Q8_K)  # a weight that got past the upload check still gets a typed error
    with pytest.raises(UnsupportedTensorTypeError):
        prepare_matmul(gpu.fresh, w, storage(gpu, np.zeros(256)), storage(gpu, np.zeros(1)), 1)


def test_shader_compile_error(gpu):
    bad = (
        "@group(0) @binding(0) var<storage, read_write> Y: array<f32>;\n"
        "@compute @workgroup_size(1)\n"
        "fn main() {\n"
        "    Y[0] = undefined_thing(1.0);\n"
        "}\n"
    )
    with pytest.raises(ShaderCompileError) as e:
        compile_pipeline(gpu, bad, label="broken/test")
    msg = str(e.value)
    assert "broken/test" in msg and "line 4" in msg
    assert "Y[0] = undefined_thing(1.0);" in msg and "undefined_thing" in msg
    # a type error in a composed source names the kernel file and its own line
    src = matmul_source(int(Q.Q8_0), driver="row").replace("return Parts4(ibytes4(", "return Parts4(1u + ibytes4(")
    with pytest.raises(ShaderCompileError) as e:
        compile_pipeline(gpu, src, label="matmul_q8_0/bad")
    msg = str(e.value)
    assert "matmul_q8_0/bad" in msg and "quant_q8_0.wgsl" in msg and "1u + ibytes4" in msg, msg
    # a missing entry point is a compile error too
    with pytest.raises(ShaderCompileError):
        compile_pipeline(gpu, load_kernel("rmsnorm"), entry="nope", label="entry")


def test_pipeline_cache_and_helpers(gpu):
    src = compose("common", "quant_q4_k", "quant_q4_k_mins", "matmul_row_io", "matmul")
    assert compile_pipeline(gpu, src) is compile_pipeline(gpu, src, label="again")
    assert driver_geometry(src) == (256, 8)
    assert driver_geometry(matmul_source(int(Q.Q4_K), driver="wg_reduce")) == (1, 8)
    assert matmul_source(int(Q.Q4_K), driver="default") == matmul_source(
        int(Q.Q4_K), driver="row" if gpu.adapter_type == "CPU" else "wg_reduce"
    )
    u = uniform(gpu.fresh, "<3I", 1, 2, 3)
    assert u.size == 16
    assert uniform(gpu.fresh, "<8I", *range(8)).size == 32


def test_uniform_per_dispatch(gpu):
    """Two dispatches in one pass, each with its own uniform, see their own values."""
    wgsl = (
        "struct P { v: f32, i: u32 }\n"
        "@group(0) @binding(0) var<storage, read_write> Y: array<f32>;\n"
        "@group(0) @binding(1) var<uniform> p: P;\n"
        "@compute @workgroup_size(1) fn main() { Y[p.i] = p.v; }\n"
    )
    pipe = compile_pipeline(gpu, wgsl, label="uniform-test")
    yb = storage(gpu, np.zeros(8))
    ds = [Dispatch(pipe, gpu.fresh.bind(pipe, [yb, uniform(gpu.fresh, "<fI", 2.5, i)]), (1, 1, 1)) for i in range(2)]
    ds[1] = Dispatch(pipe, gpu.fresh.bind(pipe, [(yb, 0, 32), uniform(gpu.fresh, "<fI", 7.0, 1)]), (1, 1, 1))
    submit(gpu, ds)
    assert read_f32(gpu, yb)[:2].tolist() == [2.5, 7.0]


def test_device_fields(gpu):
    assert isinstance(gpu, GpuDevice) and get_device() is gpu
    assert gpu.backend != "OpenGL" and gpu.adapter_type in (
        "DiscreteGPU",
        "IntegratedGPU",
        "VirtualGPU",
        "CPU",
        "Unknown",
    )
    assert gpu.limits["max-storage-buffer-binding-size"] >= 128 << 20
    assert gpu.limits["max-buffer-size"] >= 256 << 20
    assert gpu.limits["max-compute-workgroups-per-dimension"] >= 65535
    assert gpu.has_timestamps == ("timestamp-query" in gpu.features)
    assert gpu.has_f16 == ("shader-f16" in gpu.features)
    assert isinstance(gpu.has_subgroups, bool)
    d = describe()
    assert d["backend"] == gpu.backend and d["limits"]["max-buffer-size"] >= 256 << 20
    if gpu.adapter_type == "CPU":  # lavapipe, per FACTS.md
        assert gpu.has_f16 and gpu.has_subgroups and gpu.has_timestamps


def test_opengl_only_is_refused():
    from labkit.errors import NoAdapterError

    class FakeAdapter:
        info = {"device": "llvmpipe", "backend_type": "OpenGL", "adapter_type": "CPU"}

    with pytest.raises(NoAdapterError, match="mesa-vulkan-drivers"):
        pick_adapter([FakeAdapter()])

    class Vk(FakeAdapter):
        info = {"device": "lavapipe", "backend_type": "Vulkan", "adapter_type": "CPU"}

    class Gpu(FakeAdapter):
        info = {"device": "gpu", "backend_type": "Vulkan", "adapter_type": "IntegratedGPU"}

    assert isinstance(pick_adapter([FakeAdapter(), Vk(), Gpu()]), Gpu)
    assert isinstance(pick_adapter([FakeAdapter(), Vk()]), Vk)


def test_time_gemma_unembedding(gpu):
    """262144 x 640 Q8_0 matvec (Gemma 3's tied embedding as lm_head); printed, not asserted."""
    n_rows, n_cols = 262_144, 640
    seed = SEED
    rng = np.random.default_rng(seed)
    raw = random_weight(rng, Q.Q8_0, n_rows, n_cols)
    t0 = time.perf_counter()
    weight = upload_weight(gpu, "token_embd", raw, int(Q.Q8_0), n_rows, n_cols)
    t_up = time.perf_counter() - t0
    # 170 MiB: two windows on lavapipe (a 128 MiB binding), one where a binding holds it (an H200's 2 GiB)
    assert len(weight.windows) == (1 if raw.nbytes <= gpu.max_binding else 2), (len(weight.windows), gpu.max_binding)
    x = rng.standard_normal(n_cols).astype(np.float32)
    xb = storage(gpu, x)
    yb = storage(gpu, np.zeros(n_rows, np.float32))
    ds = prepare_matmul(gpu.fresh, weight, xb, yb, 1, source=matmul_source(int(Q.Q8_0), driver="row"))
    submit(gpu, ds[:1])  # warm-up: pipeline compile
    gpu.queue.read_buffer(xb)
    t0 = time.perf_counter()
    submit(gpu, ds)
    y = read_f32(gpu, yb)
    dt = time.perf_counter() - t0
    print(
        f"\n262144x640 Q8_0 matvec (row-per-thread, {len(ds)} windows): {dt * 1e3:.0f} ms; upload {t_up * 1e3:.0f} ms"
    )
    # spot-check rows against the oracle, at both sides of the window split where there is one:
    # wherever the binding limit puts it (197 379 rows of 680 bytes fit in 128 MiB), not at the half
    w0 = weight.windows[0]
    last0 = w0.first_row + w0.n_rows - 1
    if len(weight.windows) == 2:
        first1 = weight.windows[1].first_row
        assert first1 == last0 + 1 and first1 + weight.windows[1].n_rows == n_rows
        assert w0.n_rows * weight.row_bytes <= gpu.max_binding < (w0.n_rows + 1) * weight.row_bytes
    else:  # one window: a real GPU's 2 GiB binding holds the whole table
        assert (w0.first_row, w0.n_rows) == (0, n_rows)
        first1 = n_rows // 2 + 7  # then an odd row mid-table, where lavapipe's split would be
    idx = np.array([0, 1, last0 - 1, last0, first1, first1 + 1, n_rows - 1])
    rows = raw.reshape(n_rows, -1)[idx]
    want = gguf_dequantize(rows, Q.Q8_0).astype(np.float64) @ x
    check_close(y[idx], want, f"gemma-size Q8_0 rows {idx.tolist()} seed={seed}", 1e-9)


@pytest.mark.parametrize("driver", ["row", "wg_reduce"])
def test_matmul_token_chunks_within_max_binding(gpu, driver):
    """X/Y bigger than one storage binding (Gemma's [T, 262144] logits past ~128 tokens): tokens are
    split into chunks whose bindings fit, bound at 256-aligned byte offsets with the remainder in
    x_offset/y_offset. Odd T, a non-zero y_offset, every chunk edge, and two weight windows."""
    bound: list[tuple] = []

    class Spy(FreshObjects):  # what each dispatch binds as X and Y (W, X, Y, its uniform)
        def bind(self, pipeline, resources, group=0):
            bound.append(tuple(resources[1:3]))
            return super().bind(pipeline, resources, group)

    qtype, n_rows, n_cols = Q.Q8_0, 67, 96
    for i, (T, limit) in enumerate([(37, 1024), (9, 2048), (31, 700), (5, 10_000)]):
        seed = SEED + 200 + i
        rng = np.random.default_rng(seed)
        raw = random_weight(rng, qtype, n_rows, n_cols)
        weight = upload_weight(gpu, "w", raw, int(qtype), n_rows, n_cols, max_window_bytes=40 * (raw.nbytes // n_rows))
        assert len(weight.windows) == 2
        x_off, x_stride = 5 + 64 * i, n_cols + 3
        y_off, y_stride = 301 + 7 * i, n_rows + 2  # 301 floats: not a 256-byte boundary
        what = f"T={T} max_binding={limit} driver={driver} x_off={x_off} y_off={y_off} seed={seed}"
        x = rng.standard_normal(x_off + T * x_stride).astype(np.float32)
        sentinel = np.float32(-12345.0)
        y0 = np.full(y_off + T * y_stride + 3, sentinel, dtype=np.float32)
        xb, yb = storage(gpu, x), storage(gpu, y0)
        bound.clear()
        src = matmul_source(int(qtype), driver=driver)
        ds = prepare_matmul(Spy(gpu), weight, xb, yb, T, x_off, x_stride, y_off, y_stride, src, max_binding=limit)
        chunked = yb.size > limit or xb.size > limit
        assert chunked == (len(ds) > len(weight.windows)), what
        assert len(bound) == len(ds), what  # every dispatch's bind group came from the allocator handed in
        for b in (b for pair in bound for b in pair):
            if isinstance(b, tuple):
                buf, offset, size = b
                assert offset % 256 == 0 and size % 4 == 0 and size <= limit, f"{what}: bound {offset}+{size}"
                assert offset + size <= buf.size, what
            else:
                assert b.size <= limit, f"{what}: {b.size}-byte buffer bound whole"
        submit(gpu, ds)
        dims, strides = (n_rows, n_cols, T), (x_off, x_stride, y_off, y_stride)
        check_strided_output(gpu, yb, y0, sentinel, x, raw, qtype, dims, strides, what)
    # no chunk at all: one row of Y plus the alignment slack must fit
    with pytest.raises(ValueError, match="does not fit"):
        prepare_matmul(gpu.fresh, weight, xb, yb, T, x_off, x_stride, y_off, y_stride, src, max_binding=256)


def test_token_chunks_edges():
    """Chunk arithmetic: the spans tile the tokens exactly, each within the limit, as few chunks as the
    worst alignment phase allows, of even size (in whole token tiles where those fit)."""
    from labkit.gpu.matmul import token_chunks

    class Buf:
        def __init__(self, size):
            self.size = size

    rng = np.random.default_rng(SEED)
    for _ in range(200):
        T, K, N = int(rng.integers(1, 50)), int(rng.integers(1, 40)), int(rng.integers(1, 300))
        xs, ys = K + int(rng.integers(0, 5)), N + int(rng.integers(0, 5))
        xo, yo = int(rng.integers(0, 500)), int(rng.integers(0, 500))
        x, y = Buf(4 * (xo + (T - 1) * xs + K)), Buf(4 * (yo + (T - 1) * ys + N) + 16)
        limit = 4 * int(rng.integers(max(N, K) + 64, 4 * (max(N, K) + 64)))  # any row fits at any phase
        what = f"T={T} K={K} N={N} strides={xs},{ys} offsets={xo},{yo} limit={limit} seed={SEED}"
        tile = int(rng.choice([1, 4, 16]))
        chunks = token_chunks(T, x, xo, xs, K, y, yo, ys, N, limit, tile=tile)
        what += f" tile={tile}"
        assert [c.t0 for c in chunks] == list(np.cumsum([0] + [c.n for c in chunks[:-1]])), what
        assert sum(c.n for c in chunks) == T, what
        for c in chunks:
            for b, off, stride, width, base_off in ((c.y, c.y_offset, ys, N, yo), (c.x, c.x_offset, xs, K, xo)):
                if isinstance(b, tuple):
                    _, start, size = b
                    assert start % 256 == 0 and size <= limit, what
                    assert start // 4 + off == base_off + c.t0 * stride, what  # same first element
                    assert size == 4 * (off + (c.n - 1) * stride + width), what
                else:
                    assert b.size <= limit and off == base_off + c.t0 * stride, what
        if len(chunks) > 1:  # tokens that fit a binding at the worst phase (63 floats past a 256-byte boundary)
            worst = min((limit // 4 - 63 - w) // s + 1 for b, s, w in ((x, xs, K), (y, ys, N)) if b.size > limit)
            assert len(chunks) <= -(-T // worst), f"{what}: {len(chunks)} chunks where {-(-T // worst)} do"
            sizes = [c.n for c in chunks]
            assert len(set(sizes[:-1])) == 1 and sizes[-1] <= sizes[0], f"{what}: uneven chunks {sizes}"


def _numpy_epilogue(op: str, y: np.ndarray, e: np.ndarray, act: str, y_first: bool) -> np.ndarray:
    if op == "add":
        return e + y
    g, u = (y, e) if y_first else (e, y)
    return ACTIVATIONS[act](g) * u


@pytest.mark.parametrize("qtype", INTEGER_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(
    "op, act, y_first", [("add", "silu", False), ("glu", "silu", False), ("glu", "gelu_tanh", True)]
)
def test_matvec_epilogue(gpu, qtype, op, act, y_first):
    """The decode matvec fused with the next stage (labkit.gpu.fusion): Y is the plain matvec's, bit
    for bit, and Z = add / glu of Y and E matches numpy on the gguf.quants weight; 67 rows (past a
    quad), windows of at most 8 rows, odd offsets for Y, E and Z, nothing written outside them."""
    check_epilogue(gpu, qtype, op, act, y_first, "repacked")


@pytest.mark.parametrize("qtype", SPLITK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("op, act, y_first", [("add", "silu", False), ("glu", "silu", True)])
def test_splitk_matvec_epilogue(gpu, qtype, op, act, y_first):
    """The split-K decode driver fused with the next stage, as test_matvec_epilogue."""
    check_epilogue(gpu, qtype, op, act, y_first, "blocks_splitk")


def check_epilogue(gpu, qtype, op: str, act: str, y_first: bool, variant: str) -> None:
    n_rows, n_cols = shape_for(qtype)
    seed = SEED + 4000 + 10 * int(qtype) + len(op) + y_first + 5 * (variant != "repacked")
    rng = np.random.default_rng(seed)
    raw = random_weight(rng, qtype, n_rows, n_cols)
    what = f"{qtype.name} {variant} {op}/{act} y_first={y_first} seed={seed}"
    fmt = format_name(int(qtype))
    weight = upload_weight(gpu, "w", raw, int(qtype), n_rows, n_cols, max_window_bytes=13 * (raw.nbytes // n_rows) + 15)
    if variant == "repacked":
        weight = repack_weight(gpu, weight, mm_source(fmt, "repack"), max_binding=repacked_bytes(8, n_cols, 16))
        src, plain_src = epilogue_source(fmt, op), repacked_source(fmt, 1)
    else:
        kernel = get_kernel(f"matmul_{fmt}", variant, "cpu")
        limit = 8 * layout_of(kernel.repack()).row_bytes(n_cols)
        weight = repack_weight(gpu, weight, kernel.repack(), max_binding=limit)
        src, plain_src = kernel.epilogue(op), kernel.source(PassShape(1, 0))
    x = rng.standard_normal(8 + n_cols).astype(np.float32)
    e = rng.standard_normal(5 + n_rows).astype(np.float32)
    sentinel = np.float32(-12345.0)
    y_off, z_off = 7, 3
    yb, zb = storage(gpu, np.full(y_off + n_rows + 3, sentinel)), storage(gpu, np.full(z_off + n_rows + 3, sentinel))
    plain = storage(gpu, np.full(y_off + n_rows + 3, sentinel))
    xb, eb = storage(gpu, x), storage(gpu, e)
    values = {"e_offset": 5, "z_offset": z_off, "act": ACT_CODES[act], "y_first": int(y_first)}
    EPILOGUE_PARAMS.check(src, what)
    fused = prepare_matmul(gpu.fresh, weight, xb, yb, 1, 8, n_cols, y_off, n_rows, src, epilogue=([eb, zb], values))
    unfused = prepare_matmul(gpu.fresh, weight, xb, plain, 1, 8, n_cols, y_off, n_rows, plain_src)
    submit(gpu, fused + unfused)
    y, z = read_f32(gpu, yb), read_f32(gpu, zb)
    assert y.tobytes() == read_f32(gpu, plain).tobytes(), f"{what}: Y differs from the unfused matvec's"
    for buf, off in ((y, y_off), (z, z_off)):
        outside = np.r_[buf[:off], buf[off + n_rows : off + n_rows + 3]]
        assert np.all(outside == sentinel), f"{what}: wrote outside its output"
    for name, w in oracles(raw, qtype, n_rows, n_cols):
        y_ref = w @ x[8:].astype(np.float64)
        check_close(y[y_off : y_off + n_rows], y_ref, f"{what} Y vs {name}", 1e-9)
        z_ref = _numpy_epilogue(op, y_ref, e[5:].astype(np.float64), act, y_first)
        check_close(z[z_off : z_off + n_rows], z_ref, f"{what} Z vs {name}", 1e-9)
