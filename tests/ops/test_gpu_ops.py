"""Each non-matmul WGSL kernel on the real wgpu device against the numpy reference op.

Fresh random data per run (seed in the failure message), odd sizes, offsets into
the KV cache, and the 2-D grid path.
"""

from __future__ import annotations

import numpy as np
import pytest
import wgpu

from labkit.gpu.device import get_device
from labkit.gpu.dispatch import Dispatch, grid, run
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.texture import Rows, bind_operands
from labkit.ops import OPS, attn_ctx, attn_scores, glu, rmsnorm, rope, softmax
from labkit.ops.base import PassShape, wgsl_const
from labkit.ops.registry import get_kernel, get_policy, kernel_source

SEED = int(np.random.SeedSequence().entropy % 2**32)
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


@pytest.fixture(scope="module")
def gpu():
    return get_device()


def rng():
    return np.random.default_rng(SEED)


def buf(gpu, a: np.ndarray):
    return gpu.device.create_buffer_with_data(data=np.ascontiguousarray(a, dtype=np.float32).tobytes(), usage=STORAGE)


def empty(gpu, n: int, fill: float = np.nan):
    return buf(gpu, np.full(n, fill, dtype=np.float32))


def launch(gpu, op: str, buffers: list, values: dict, n_workgroups: int, source: str | None = None):
    """One dispatch of an op's kernel, its uniform packed by field name (as the executor does);
    an operand given as Rows is bound as the executor binds it (a texture where the kernel reads one)."""
    source = source or kernel_source(op)
    OPS[op].params.check(source, op)
    pipe = compile_pipeline(gpu, source, label=op)
    u = gpu.fresh.uniform(OPS[op].params.pack(source, values))
    bound, fills = bind_operands(gpu.fresh, source, buffers, op)
    run(gpu, [*fills, Dispatch(pipe, gpu.fresh.bind(pipe, [*bound, u]), grid(n_workgroups), op)])


def read(gpu, b, n: int) -> np.ndarray:
    return np.frombuffer(gpu.queue.read_buffer(b, 0, 4 * n), dtype=np.float32).copy()


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


def assert_close(got, want, thresh: float, what: str):
    err = nmse(got, want)
    mx = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    assert err <= thresh, f"{what}: nmse {err:.3e} > {thresh:.0e}, max|diff| {mx:.3e} (seed {SEED})"


@pytest.mark.parametrize("driver", ["lanes8", "wide"])
@pytest.mark.parametrize("n_groups,group", [(1, 640), (7, 640), (28, 256), (5, 37), (1, 4099)])
def test_rmsnorm(gpu, n_groups, group, driver):
    """Both correct drivers: 8 threads a group (CPU) and a workgroup of 256 a group (GPU), on rows
    narrower and wider than 256 and of odd width."""
    source = get_kernel("rmsnorm", driver).source()
    r = rng()
    x = r.standard_normal((n_groups, group)) * r.uniform(0.1, 100)
    w = r.standard_normal(group)
    y = empty(gpu, x.size)
    values = {"n_groups": n_groups, "group": group, "eps": 1e-6}
    launch(gpu, "rmsnorm", [buf(gpu, x), buf(gpu, w), y], values, rmsnorm.workgroups(n_groups, source), source)
    assert_close(read(gpu, y, x.size), rmsnorm.rmsnorm(x, w, 1e-6, group).ravel(), 1e-12, "rmsnorm")


@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize(
    "T,n_heads,head_dim,rope_dim,pos0,base",
    [(7, 4, 256, 256, 0, 1e6), (3, 9, 64, 64, 11, 1e5), (1, 1, 256, 256, 517, 1e4), (5, 3, 64, 32, 2, 1e4)],
)
def test_rope(gpu, style, T, n_heads, head_dim, rope_dim, pos0, base):
    x = rng().standard_normal((T, n_heads * head_dim))
    y_off = 3 * n_heads * head_dim  # written at an offset, as k_rope writes into the cache
    y = empty(gpu, y_off + x.size)
    launch(
        gpu,
        "rope",
        [buf(gpu, x), y, buf(gpu, x)],  # no rope_freqs: x bound there, unread
        dict(
            T=T,
            n_heads=n_heads,
            head_dim=head_dim,
            rope_dim=rope_dim,
            pos0=pos0,
            neox=int(style == "neox"),
            base=base,
            y_offset=y_off,
            # unscaled (tests/ops/test_ops.py has the scaled cases)
            **{k: rope.UNSCALED[k] for k in ("freq_scale", "ext_factor", "attn_factor")},
            corr_low=0.0,
            corr_high=0.0,
            has_factors=0,
        ),  # fmt: skip
        rope.workgroups(x.size),
    )
    want = rope.rope(x, pos0 + np.arange(T), n_heads, head_dim, rope_dim, base, style)
    got = read(gpu, y, y_off + x.size)
    assert np.isnan(got[:y_off]).all(), "rope wrote before its offset"
    assert_close(got[y_off:], want.ravel(), 1e-8, f"rope {style}")  # f32 angles at pos ~500


@pytest.mark.parametrize(
    "T,n_past,H,KV,hd,window",
    [
        (7, 0, 4, 1, 256, None),
        (6, 0, 9, 3, 64, None),
        (1, 9, 9, 3, 64, None),
        (9, 3, 4, 2, 32, 4),
        (1, 20, 4, 1, 16, 8),
        (12, 0, 4, 2, 32, 5),
        (200, 0, 2, 1, 32, 20),  # prefill: 2 key workgroups of scores, the first before the last queries' window
        (147, 0, 3, 3, 16, None),  # prefill: 10 query tiles (the last partial), 2 key workgroups, causal skips
        (9, 70, 4, 1, 256, None),  # 79 keys: two key chunks of the tiled kernel, two query tiles
        (17, 60, 2, 1, 48, 40),  # a partial tile, a window across the chunk edge, head_dim % 64 != 0
        (1, 40, 14, 2, 96, None),  # decode: 7 heads a KV head (a group of 4 and one of 3), head_dim % 32 == 0
        (1, 36, 8, 8, 40, 19),  # decode: one head a KV head, head_dim % 32 != 0, 37 keys in a window of 19
        (1, 299, 8, 2, 64, 97),  # decode: 300 keys, a window of 97 not a multiple of the wide driver's 32 slices
    ],
)
@pytest.mark.parametrize("path,sinks", [("default", False), ("general", False), ("default", True)])
def test_attention_stages(gpu, path, sinks, T, n_past, H, KV, hd, window):
    """ "default" picks the prefill kernel (n_past 0) or the decode kernel (T 1); "general" does all.
    The fused tiers are checked against the same numbers. With sinks (gpt-oss), each head's sink
    logit takes its share of the softmax in the unfused kernel and in every fused tier."""
    r = rng()
    sink = r.standard_normal(H) * 2.0
    S = n_past + T
    q = r.standard_normal((T, H * hd))
    k = r.standard_normal((S + 2, KV * hd))  # cache capacity beyond the keys in use
    v = r.standard_normal((S + 2, KV * hd))
    scale = 1 / np.sqrt(hd)
    scores = empty(gpu, H * T * S)
    src = get_kernel("attn_scores", path).source(PassShape(T, n_past))
    vals = dict(T=T, n_keys=S, n_past=n_past, n_heads=H, n_kv_heads=KV, head_dim=hd, window=window or 0, scale=scale,
                softcap=0.0, sinks=int(sinks))  # fmt: skip
    sink_buf = buf(gpu, sink)
    qr, kr, vr = (
        Rows(buf(gpu, q), 0, H * hd, H * hd, T),
        Rows(buf(gpu, k), 0, KV * hd, KV * hd, S),
        Rows(buf(gpu, v), 0, KV * hd, KV * hd, S),
    )
    launch(gpu, "attn_scores", [qr, kr, scores], vals, attn_scores.tiled_workgroups(src, H, T, S, KV), src)
    want_s = attn_scores.scores(q, k[:S], n_past, H, KV, hd, scale, window)
    got_s = read(gpu, scores, H * T * S).reshape(H, T, S)
    assert np.array_equal(np.isneginf(got_s), np.isneginf(want_s)), f"mask differs (seed {SEED})"
    fin = np.isfinite(want_s)
    assert_close(got_s[fin], want_s[fin], 1e-11, "attn_scores")

    probs = empty(gpu, H * T * S)
    sm = {"n_rows": H * T, "n": S, "rows_per_head": T, "sinks": int(sinks)}
    launch(gpu, "softmax", [scores, probs, sink_buf], sm, softmax.workgroups(H * T))
    want_p = softmax.with_sinks(want_s, sink) if sinks else softmax.softmax(want_s)
    if sinks:
        assert np.all(want_p.sum(-1) < 1.0), "a sink takes a share of every row"
    got_p = read(gpu, probs, H * T * S).reshape(H, T, S)
    assert_close(got_p, want_p, 1e-11, "softmax")

    # every fused tier, the tiled one also with the streaming count (000's dispatch bug): the extra
    # workgroups must not change a single value, and every output must be written
    want_c = attn_ctx.context(want_p, v[:S], H, KV, hd).ravel()
    wrong_count = get_policy("attn_workgroups", "streaming_count").workgroups
    for name, rule in (("streaming", None), ("tiled", None), ("tiled", wrong_count)):
        kernel = get_kernel("attn_ctx", name)
        rule = rule or kernel.workgroups or (lambda T, H, size: attn_ctx.workgroups(size))
        fused = empty(gpu, T * H * hd)
        bufs = [qr, kr, vr, fused, sink_buf]
        launch(gpu, "attn_ctx", bufs, vals, rule(T, H, T * H * hd), kernel.source())
        got = read(gpu, fused, T * H * hd)
        assert not np.isnan(got).any(), f"{name}: {int(np.isnan(got).sum())} outputs unwritten (seed {SEED})"
        assert_close(got, want_c, 1e-11, f"{name} attention")

    for name in ("masked", "masked_wide"):  # the pass shape's kernel: prefill tiles, or a decode step's units
        ctx = empty(gpu, T * H * hd)
        ctx_src = get_kernel("attn_ctx", name).source(PassShape(T, n_past))
        launch(gpu, "attn_ctx", [probs, vr, ctx], vals, attn_ctx.unfused_workgroups(ctx_src, T, vals), ctx_src)
        assert_close(read(gpu, ctx, T * H * hd), want_c, 1e-11, f"{name} {'decode' if T == 1 else 'prefill'}")


@pytest.mark.parametrize("H,KV,hd,S", [(14, 2, 96, 37), (8, 8, 40, 37), (4, 1, 256, 37), (4, 2, 64, 9)])
def test_a_decode_step_attends_as_the_prefill_does_bit_for_bit(gpu, H, KV, hd, S):
    """The decode kernels (a thread per key or vec4 for a group of heads) sum in the prefill
    kernels' order: the last query's scores and context are the same floats either way, so a
    position's logits do not depend on whether a prefill or a decode step computed it. S = 9: a
    prompt shorter than the prefill tile, whose scores kernel is attn_scores_prefill_short.wgsl."""
    r = rng()
    q, k, v = r.standard_normal((S, H * hd)), r.standard_normal((S, KV * hd)), r.standard_normal((S, KV * hd))
    P = dict(n_heads=H, n_kv_heads=KV, head_dim=hd, window=0, scale=1 / np.sqrt(hd), softcap=0.0, sinks=0)

    def attend(T: int, n_past: int) -> tuple[np.ndarray, np.ndarray]:
        vals = dict(T=T, n_keys=S, n_past=n_past, **P)
        qr = Rows(buf(gpu, q[n_past:]), 0, H * hd, H * hd, T)
        kr, vr = (Rows(buf(gpu, a), 0, KV * hd, KV * hd, S) for a in (k, v))
        src = get_kernel("attn_scores", "default").source(PassShape(T, n_past))
        scores, probs, ctx = empty(gpu, H * T * S), empty(gpu, H * T * S), empty(gpu, T * H * hd)
        launch(gpu, "attn_scores", [qr, kr, scores], vals, attn_scores.tiled_workgroups(src, H, T, S, KV), src)
        sm = {"n_rows": H * T, "n": S, "rows_per_head": T, "sinks": 0}
        launch(gpu, "softmax", [scores, probs, scores], sm, softmax.workgroups(H * T))
        src = get_kernel("attn_ctx", "default").source(PassShape(T, n_past))
        launch(gpu, "attn_ctx", [probs, vr, ctx], vals, attn_ctx.unfused_workgroups(src, T, P), src)
        return read(gpu, scores, H * T * S).reshape(H, T, S)[:, -1], read(gpu, ctx, T * H * hd).reshape(T, -1)[-1]

    (s_prefill, c_prefill), (s_decode, c_decode) = attend(S, 0), attend(1, S - 1)
    assert_close(s_decode, attn_scores.scores(q, k, 0, H, KV, hd, P["scale"], None)[:, -1], 1e-11, "decode scores")
    assert np.array_equal(s_decode, s_prefill), f"scores differ: max {np.max(np.abs(s_decode - s_prefill)):.3e}"
    assert np.array_equal(c_decode, c_prefill), f"context differs: max {np.max(np.abs(c_decode - c_prefill)):.3e}"


@pytest.mark.parametrize("T,n_past,window", [(24, 0, 4), (1, 30, 8), (20, 12, None)])  # T > 16: a second tile
def test_attn_ctx_sums_the_keys_the_mask_shows(gpu, T, n_past, window):
    """The default context kernel sums only the keys one of a tile's queries may see (as flash
    attention does): an infinite V row at a key masked for a whole tile of queries leaves their
    context finite, equal to numpy's over the other keys. `every_key` sums every key and gets
    0 · inf = NaN there, as the unfused formula does. Both match numpy when V is finite."""
    r = rng()
    H, KV, hd = 4, 2, 32
    S = n_past + T
    q, k = r.standard_normal((T, H * hd)), r.standard_normal((S, KV * hd))
    p = softmax.softmax(attn_scores.scores(q, k, n_past, H, KV, hd, 1 / np.sqrt(hd), window))
    v = r.standard_normal((S, KV * hd))
    bad_key = 0 if window else S - 1  # before the window of late queries / in the future of early ones
    tile = wgsl_const(kernel_source("attn_ctx", "default"), "TILE_T", 1)
    first = n_past + np.arange(T) // tile * tile  # each query's tile: its first and last query's positions
    last = n_past + np.minimum(np.arange(T) // tile * tile + tile - 1, T - 1)
    masked = (first - bad_key >= window) if window else (last < bad_key)
    assert masked.any()
    v_inf = v.copy()
    v_inf[bad_key] = np.inf
    vals = dict(T=T, n_keys=S, n_past=n_past, n_heads=H, n_kv_heads=KV, head_dim=hd, window=window or 0,
                scale=1.0, softcap=0.0, sinks=0)  # fmt: skip

    def ctx_of(kernel: str, values: np.ndarray) -> np.ndarray:
        out = empty(gpu, T * H * hd)
        rows = Rows(buf(gpu, values), 0, KV * hd, KV * hd, S)
        src = get_kernel("attn_ctx", kernel).source(PassShape(T, n_past))
        launch(gpu, "attn_ctx", [buf(gpu, p), rows, out], vals, attn_ctx.unfused_workgroups(src, T, vals), src)
        return read(gpu, out, T * H * hd).reshape(T, H * hd)

    want = attn_ctx.context(p, v, H, KV, hd)
    without_bad = v.copy()
    without_bad[bad_key] = 0.0
    for kernel in ("masked", "masked_wide", "every_key"):
        assert_close(ctx_of(kernel, v).ravel(), want.ravel(), 1e-11, kernel)
    for kernel in ("masked", "masked_wide"):
        got = ctx_of(kernel, v_inf)[masked]
        assert np.isfinite(got).all(), f"{kernel}: an inf at a masked key reached the context"
        want_masked = attn_ctx.context(p, without_bad, H, KV, hd)[masked].ravel()
        assert_close(got.ravel(), want_masked, 1e-11, f"{kernel}, inf V")
    assert np.isnan(ctx_of("every_key", v_inf)[masked]).all(), "every_key: 0 * inf at a masked key must be NaN"


def test_softmax_large_row_and_fully_masked_row(gpu):
    r = rng()
    n = 262144
    x = np.stack([r.standard_normal(n) * 10, np.full(n, -np.inf)])
    y = empty(gpu, x.size)
    values = {"n_rows": 2, "n": n, "rows_per_head": 1, "sinks": 0}
    launch(gpu, "softmax", [buf(gpu, x), y, buf(gpu, x[0, :4])], values, softmax.workgroups(2))
    got = read(gpu, y, x.size).reshape(2, n)
    assert_close(got[0], softmax.softmax(x[0]), 1e-10, "softmax 262144")
    assert np.all(got[1] == 0), "an all-masked row must give zeros, not NaN"


@pytest.mark.parametrize("n", [35, 43, 50, 57])
def test_softmax_writes_only_its_rows(gpu, n):
    """Rows that fill no whole workgroup (11 rows, 8 a workgroup) and row lengths that end in each
    quarter of a loop turn (32 values, 4 a thread 8 apart): each row's values, and nothing after
    the last row."""
    r = rng()
    rows = 11
    x = r.standard_normal((rows, n)) * 4
    x[3, 20:] = -np.inf
    y = empty(gpu, rows * n + 64)
    values = {"n_rows": rows, "n": n, "rows_per_head": rows, "sinks": 0}
    launch(gpu, "softmax", [buf(gpu, x), y, buf(gpu, x[0, :4])], values, softmax.workgroups(rows))
    got = read(gpu, y, rows * n + 64)
    assert_close(got[: rows * n].reshape(rows, n), softmax.softmax(x), 1e-11, f"softmax 11 x {n}")
    assert np.isnan(got[rows * n :]).all(), "softmax wrote past its last row"


def swiglu_oai_ggml(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml-cpu's swiglu_oai, written from its source: x = min(g, limit), y = clamp(u, ±limit),
    out = x · sigmoid(alpha · x) · (y + 1), alpha 1.702, limit 7 (llama.cpp's gpt-oss graph)."""
    x = np.minimum(g, 7.0)
    return x * (1.0 / (1.0 + np.exp(-1.702 * x))) * (np.clip(u, -7.0, 7.0) + 1.0)


@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "swiglu_oai"])
def test_glu(gpu, act):
    """Each activation on values past its clamps (gpt-oss clamps at 7): exp/tanh never overflow."""
    r = rng()
    n = 7 * 2048 + 3
    g = r.standard_normal(n) * 8
    g[:4] = [60.0, -60.0, 300.0, -300.0]  # tanh/exp must not overflow into NaN
    u = r.standard_normal(n) * 8
    y = empty(gpu, n)
    launch(gpu, "glu", [buf(gpu, g), buf(gpu, u), y], {"n": n, "act": glu.ACT_CODES[act]}, glu.workgroups(n))
    got = read(gpu, y, n)
    assert np.isfinite(got).all()
    want = swiglu_oai_ggml(g, u) if act == "swiglu_oai" else glu.ACTIVATIONS[act](g) * u
    assert_close(got, want, 1e-11, act)


def test_add_with_period_and_2d_grid(gpu):
    r = rng()
    n = 64 * 70000 + 5  # more than 65 535 workgroups: the 2-D grid path
    a = r.standard_normal(n).astype(np.float32)
    b = r.standard_normal(n).astype(np.float32)
    y = empty(gpu, n)
    launch(gpu, "add", [buf(gpu, a), buf(gpu, b), y], {"n": n, "period": n, "y_offset": 0, "scale": 1.0}, -(-n // 64))
    got = read(gpu, y, n)
    assert np.array_equal(got, a + b), f"add differs at {np.flatnonzero(got != a + b)[:5]} (seed {SEED})"
    bias = r.standard_normal(192).astype(np.float32)
    m = 5 * 192
    y2 = empty(gpu, m)
    launch(
        gpu,
        "add",
        [buf(gpu, a[:m]), buf(gpu, bias), y2],
        {"n": m, "period": 192, "y_offset": 0, "scale": 1.0},
        -(-m // 64),
    )
    assert np.array_equal(read(gpu, y2, m), a[:m] + np.tile(bias, 5))


def test_scale(gpu):
    x = rng().standard_normal(640 * 7).astype(np.float32)
    y = empty(gpu, x.size)
    launch(gpu, "embed", [buf(gpu, x), y], {"n": x.size, "scale": np.float32(25.298)}, -(-x.size // 64))
    assert np.array_equal(read(gpu, y, x.size), x * np.float32(25.298))


def test_add_writes_at_output_offset(gpu):
    """The third Params field places the sum inside a bigger buffer (qwen2's biased v goes into the
    KV cache at n_past * kv_dim); nothing before or after it is touched."""
    r = rng()
    width, rows, y_off = 96, 3, 7 * 96 + 5
    a = r.standard_normal(rows * width).astype(np.float32)
    bias = r.standard_normal(width).astype(np.float32)
    y = empty(gpu, y_off + a.size + 11, fill=-7.0)
    values = {"n": a.size, "period": width, "y_offset": y_off, "scale": 1.0}
    launch(gpu, "add", [buf(gpu, a), buf(gpu, bias), y], values, -(-a.size // 64))
    got = read(gpu, y, y_off + a.size + 11)
    assert np.all(got[:y_off] == -7.0) and np.all(got[y_off + a.size :] == -7.0), f"add wrote outside (seed {SEED})"
    want = a + np.tile(bias, rows)
    assert np.array_equal(got[y_off : y_off + a.size], want), f"add at offset {y_off} differs (seed {SEED})"


Y_BINDING = "@group(0) @binding(0) var<storage, read_write> Y: array<f32>;"
Y_AT_1 = "@group(0) @binding(1) var<storage, read_write> Y: array<f32>;"


def _write_pipeline(gpu, bindings: str, value: str):
    src = f"{bindings}\n@compute @workgroup_size(1) fn main() {{ Y[0] = {value}; }}"
    return compile_pipeline(gpu, src, label="encode test")


@pytest.mark.parametrize("path", ["native", "wgpu-py"])
def test_dispatches_are_recorded_in_order_with_their_bind_groups(gpu, path, monkeypatch):
    """encode records through wgpu-native's own functions (dispatch._record_native), or wgpu-py's
    methods where this wgpu-py has none: either way each dispatch runs its own pipeline over its
    own bind group, in the order given."""
    from labkit.gpu import dispatch

    assert dispatch._NATIVE_PASS_CALLS is not None, "this wgpu-py no longer offers the native recording path"
    if path == "wgpu-py":
        monkeypatch.setattr(dispatch, "_NATIVE_PASS_CALLS", None)
    y = empty(gpu, 4)
    store = _write_pipeline(gpu, Y_BINDING, "3.5")
    double = _write_pipeline(gpu, Y_BINDING, "Y[0] * 2.0")
    run(
        gpu,
        [Dispatch(store, gpu.fresh.bind(store, [y]), grid(1)), Dispatch(double, gpu.fresh.bind(double, [y]), grid(1))],
    )
    got = np.frombuffer(gpu.queue.read_buffer(y), np.float32)[0]
    assert got == 7.0, f"store then double gave {got}, want 7.0"


def test_a_run_of_one_pipeline_keeps_each_dispatchs_bind_group(gpu):
    """The native path sets a pipeline once for consecutive dispatches of it (and a compiled step
    records from kept handles, dispatch.native_commands): each still binds its own group."""
    from labkit.gpu import dispatch

    y1, y2 = empty(gpu, 4), empty(gpu, 4)
    store = _write_pipeline(gpu, Y_BINDING, "3.5")
    double = _write_pipeline(gpu, Y_BINDING, "Y[0] * 2.0")
    ds = [Dispatch(store, gpu.fresh.bind(store, [y]), grid(1)) for y in (y1, y2)]
    ds.append(Dispatch(double, gpu.fresh.bind(double, [y2]), grid(1)))
    enc = gpu.device.create_command_encoder()
    dispatch.encode(enc, [], commands=dispatch.native_commands(ds))
    gpu.queue.submit([enc.finish()])
    got = [float(np.frombuffer(gpu.queue.read_buffer(y), np.float32)[0]) for y in (y1, y2)]
    assert got == [3.5, 7.0], got


def test_a_dispatch_over_another_pipelines_bind_group_raises(gpu):
    """The native recording path skips wgpu-py's per-call checks; wgpu still validates the pass
    when its encoder finishes, so a mismatched bind group is a GPUValidationError, not silence."""
    y, u = empty(gpu, 4), gpu.fresh.uniform(np.zeros(4, np.float32).tobytes())
    plain = _write_pipeline(gpu, Y_BINDING, "1.0")
    uniform_then_y = "@group(0) @binding(0) var<uniform> U: vec4<f32>;\n" + Y_AT_1
    with_uniform = _write_pipeline(gpu, uniform_then_y, "U.x")
    wrong = Dispatch(plain, gpu.fresh.bind(with_uniform, [u, y]), grid(1))
    with pytest.raises(wgpu.GPUValidationError):
        run(gpu, [wrong])
