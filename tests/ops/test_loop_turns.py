"""llvmpipe's cap on an invocation's loop turns, and the fused attention tiers kept within it.

llvmpipe (lavapipe) stops all of an invocation's loops after 65535 turns in total, with no error:
the streaming tier over a 3000-key context (head_dim 128) came out wrong. The tiers write their
inner loops out, labkit.ops.attn_ctx.loop_turns counts what remains, and attn_ctx.plan refuses a
context past it; the unfused kernels, a key a turn, are refused past 65534 keys. On a real GPU
there is no cap and nothing is refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import wgpu
from test_gpu_ops import buf, empty, launch, read

import labkit
from labkit.errors import GpuLimitError
from labkit.gpu.device import LLVMPIPE_LOOP_TURNS, GpuDevice, get_device
from labkit.ops import attn_ctx, attn_scores, softmax
from labkit.ops.attn_ctx import loop_turns as attn_loop_turns
from labkit.ops.base import PassShape
from labkit.ops.registry import get_kernel

TWO_LOOPS = """@group(0) @binding(0) var<storage, read_write> Y: array<u32>;
struct P { n: u32, a: u32, b: u32, c: u32 }
@group(0) @binding(1) var<uniform> p: P;
@compute @workgroup_size(1)
fn main() {
    var c1 = 0u; for (var i = 0u; i < p.n; i++) { c1 += 1u; }
    var c2 = 0u; for (var i = 0u; i < p.n; i++) { c2 += 1u; }
    Y[0] = c1; Y[1] = c2;
}"""


@pytest.fixture(scope="module")
def gpu():
    return get_device()


def on_llvmpipe(gpu) -> None:
    if gpu.loop_turn_cap is None:
        pytest.skip("the loop-turn cap is llvmpipe's")


def test_llvmpipe_stops_an_invocations_loops_after_65535_turns(gpu):
    """Two loops of 40000 trips: the first ends after 40000 turns and its ending test, the second
    gets what is left of 65535. If Mesa drops or moves the cap, this fails: revisit attn_loop_turns."""
    on_llvmpipe(gpu)
    dev = gpu.device
    y = dev.create_buffer(size=8, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    u = dev.create_buffer_with_data(data=struct.pack("4I", 40000, 0, 0, 0), usage=wgpu.BufferUsage.UNIFORM)
    module = dev.create_shader_module(code=TWO_LOOPS)
    pl = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    entries = [{"binding": 0, "resource": {"buffer": y}}, {"binding": 1, "resource": {"buffer": u}}]
    bg = dev.create_bind_group(layout=pl.get_bind_group_layout(0), entries=entries)
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pl)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(1)
    cp.end()
    dev.queue.submit([enc.finish()])
    got = np.frombuffer(dev.queue.read_buffer(y), np.uint32)
    assert list(got) == [40000, LLVMPIPE_LOOP_TURNS - attn_loop_turns.loop(40000)], got


def fused_context(gpu, tier: str, T: int, n_past: int, hd: int) -> tuple[np.ndarray, np.ndarray]:
    """One head's context from a fused tier, and numpy's."""
    r = np.random.default_rng(7)
    S = n_past + T
    q, k, v = r.standard_normal((T, hd)), r.standard_normal((S, hd)), r.standard_normal((S, hd))
    scale = 1 / np.sqrt(hd)
    vals = dict(T=T, n_keys=S, n_past=n_past, n_heads=1, n_kv_heads=1, head_dim=hd, window=0, scale=scale,
                softcap=0.0, sinks=0)  # fmt: skip
    want = attn_ctx.context(softmax.softmax(attn_scores.scores(q, k, n_past, 1, 1, hd, scale, None)), v, 1, 1, hd)
    kernel = get_kernel("attn_ctx", tier)
    n_wg = kernel.workgroups(T, 1, T * hd) if kernel.workgroups else attn_ctx.workgroups(T * hd)
    out = empty(gpu, T * hd)
    launch(
        gpu, "attn_ctx", [buf(gpu, q), buf(gpu, k), buf(gpu, v), out, buf(gpu, q[0, :4])], vals, n_wg, kernel.source()
    )
    return read(gpu, out, T * hd), want.ravel()


@pytest.mark.parametrize("tier", ["streaming", "tiled"])
@pytest.mark.parametrize("hd", [36, 128])
def test_fused_tier_is_right_at_its_longest_context(gpu, tier, hd):
    """At the most keys the count allows, against numpy; on a GPU, 3000. The tiled tier runs a full
    tile of 8 queries (its invocations loop over the tile); the streaming tier's invocations are
    each one query's, so one query at the bound takes the turns its last query would (8 took 84 s)."""
    cap = gpu.loop_turn_cap
    keys = attn_loop_turns.max_keys(tier, hd, cap) if cap else 3000
    T = 8 if tier == "tiled" else 1
    got, want = fused_context(gpu, tier, T, keys - T, hd)
    err = float(np.abs(got - want).max())
    assert err < 1e-5, f"{tier} over {keys} keys, head_dim {hd}: max|diff| {err:.2e}"


def test_unfused_decode_is_right_at_its_longest_context(gpu):
    """The unfused decode kernel (V a buffer, so no 16384-row texture bound) loops a key a turn: at
    65534 keys, the most the cap allows, one head of 16 dims against numpy; on a GPU, 70000."""
    cap = gpu.loop_turn_cap
    keys = attn_loop_turns.max_keys("masked", 16, cap) if cap else 70000
    assert not cap or keys == cap - 1
    r = np.random.default_rng(11)
    p = softmax.softmax(r.standard_normal((1, 1, keys)) * 3)
    v = r.standard_normal((keys, 16))
    vals = dict(T=1, n_keys=keys, n_past=keys - 1, n_heads=1, n_kv_heads=1, head_dim=16, window=0, scale=0.25,
                softcap=0.0, sinks=0)  # fmt: skip
    out = empty(gpu, 16)
    src = get_kernel("attn_ctx", "default").source(PassShape(1, keys - 1))
    launch(gpu, "attn_ctx", [buf(gpu, p), buf(gpu, v), out], vals, 1, src)
    want = attn_ctx.context(p, v, 1, 1, 16).ravel()
    err = float(np.abs(read(gpu, out, 16) - want).max())
    assert err < 1e-5, f"unfused decode over {keys} keys: max|diff| {err:.2e}"


def test_the_count_refuses_one_key_past_the_bound():
    for tier in attn_loop_turns.TURNS:
        longest = attn_loop_turns.max_keys(tier, 128, LLVMPIPE_LOOP_TURNS)
        attn_loop_turns.check("blk.0.attn_ctx", tier, longest, 128, LLVMPIPE_LOOP_TURNS)
        attn_loop_turns.check("blk.0.attn_ctx", tier, 10**6, 128, None)  # no cap on a GPU
        with pytest.raises(GpuLimitError, match=f"{tier} attention kernel over {longest + 1} keys"):
            attn_loop_turns.check("blk.0.attn_ctx", tier, longest + 1, 128, LLVMPIPE_LOOP_TURNS)
    attn_loop_turns.check("blk.0.attn_ctx", "a_users_tier", 10**6, 128, LLVMPIPE_LOOP_TURNS)  # uncounted


def test_a_pass_past_the_bound_is_a_typed_error(tiny_model, monkeypatch):
    """attn_ctx.plan asks the device's cap: with a small one, a tiny model's streaming pass over 40
    tokens is refused before anything runs, and the unfused default still runs."""
    monkeypatch.setattr(GpuDevice, "loop_turn_cap", property(lambda self: 60))
    lab = labkit.open(tiny_model("llama", "Q8_0"), variants={"attn_ctx": "streaming"})
    ids = list(range(1, 41))
    with pytest.raises(GpuLimitError, match="loop turns"):
        lab.run(ids, names=["logits"])
    lab.use("attn_ctx", "default")
    assert np.isfinite(lab.run(ids, names=["logits"]).logits()).all()
    with pytest.raises(GpuLimitError, match="masked attention kernel over 80 keys"):
        lab.run(list(range(1, 81)), names=["logits"])


def test_errors_suggest_the_fused_tier_that_reaches_the_context():
    """A context too long for the unfused attention is told to use tiled (the fast fused tier) while
    the loop cap lets it run, streaming past that, and neither past streaming's reach; with no cap
    (a real GPU), always tiled. The bounds are the ones the tests above check on lavapipe."""
    cap = LLVMPIPE_LOOP_TURNS
    tiled, streaming = (attn_loop_turns.max_keys(k, 256, cap) for k in ("tiled", "streaming"))
    assert (tiled, streaming) == (13632, 32767)
    assert attn_loop_turns.fused_tier(4096, cap) == "tiled"
    assert attn_loop_turns.fused_tier(tiled, cap) == "tiled"
    assert attn_loop_turns.fused_tier(tiled + 1, cap) == "streaming"
    assert attn_loop_turns.fused_tier(streaming + 1, cap) is None
    assert attn_loop_turns.fused_tier(1 << 20, None) == "tiled"
    assert 'lab.use("attn_ctx", "streaming")' in attn_loop_turns.fused_tier_hint(16385, cap)
    assert "shorter prompt" in attn_loop_turns.fused_tier_hint(streaming + 1, cap)
