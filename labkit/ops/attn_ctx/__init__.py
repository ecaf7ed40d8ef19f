"""attn_ctx: each query's context vector, the probability-weighted sum of the values.

Values come from this layer's V cache (`kv_read`). The fused tiers (`streaming`, `tiled`)
compute scores, softmax and context in one kernel straight from q and the K and V caches:
the scores and probabilities are then never materialized, so those stages are skipped
(derived from the graph: nothing else reads them). How many workgroups a fused tier gets
is a host dispatch policy, `attn_workgroups`; `streaming_count` is post-mortem 000's
phase-2 fault (the tiled tier dispatched with the streaming tier's count)."""

from __future__ import annotations

import numpy as np

from labkit.ops import attn_scores
from labkit.ops.attn_ctx import loop_turns as attn_loop_turns
from labkit.ops.base import Kernel, Op, PassShape, Policy, ceil_div, compose, from_file, wgsl_const, wgsl_file

PARAMS = attn_scores.PARAMS  # the fused tiers need every field; the unfused kernel reads a few


def context(p: np.ndarray, v_all: np.ndarray, n_heads: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    H, T, S = p.shape
    vh = np.repeat(v_all.reshape(S, n_kv_heads, head_dim).transpose(1, 0, 2), n_heads // n_kv_heads, axis=0)
    return np.einsum("hts,hsd->thd", p, vh).reshape(T, n_heads * head_dim)


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    return context(ref.x[0], ref.cached("v"), P["n_heads"], P["n_kv_heads"], P["head_dim"])


def workgroups(size: int) -> int:
    """One thread per output element, 64 a workgroup (the unfused and streaming kernels)."""
    return ceil_div(size, 64)


def unfused_workgroups(source: str, T: int, P: dict) -> int:
    """Workgroups of an unfused kernel: one thread per TILE_T tokens x TILE_D dims of a head, 64
    a workgroup (1 x 1 without the constants); for a kernel declaring DIMS_PER_WG, one workgroup
    per that many dims of a group of heads (attn_scores.head_groups)."""
    dims_per_wg = wgsl_const(source, "DIMS_PER_WG", 0)
    if dims_per_wg:
        groups = attn_scores.head_groups(source, P["n_heads"], P["n_kv_heads"])
        return ceil_div(T, wgsl_const(source, "TILE_T", 1)) * groups * ceil_div(P["head_dim"], dims_per_wg)
    per_head = ceil_div(P["head_dim"], wgsl_const(source, "TILE_D", 1))
    return workgroups(ceil_div(T, wgsl_const(source, "TILE_T", 1)) * P["n_heads"] * per_head)


def plan(stage, gpu):
    P = stage.params
    out = gpu.output((gpu.T, P["n_heads"] * P["head_dim"]))
    values = attn_scores.uniforms(stage, gpu.T, gpu.n_past)
    kernel, policy = gpu.kernel, gpu.policy("attn_workgroups")
    attn_loop_turns.check(stage.name, kernel.name, gpu.n_past + gpu.T, P["head_dim"], gpu.loop_turn_cap)
    if not kernel.fused:
        src = kernel.source(PassShape(gpu.T, gpu.n_past))
        vw = P["n_kv_heads"] * P["head_dim"]
        v = gpu.rows(gpu.cache("v"), 0, vw, vw, gpu.n_past + gpu.T)  # a buffer, or a texture where the kernel reads one
        gpu.dispatch([gpu.input(0).buffer, v, out.buffer], values, unfused_workgroups(src, gpu.T, P))
        return out
    rule = policy.workgroups or kernel.workgroups
    n_wg = rule(gpu.T, P["n_heads"], out.size) if rule else workgroups(out.size)
    q = gpu.input(2).buffer
    sinks = gpu.vector(P["sinks"]) if P.get("sinks") else q  # without sinks: bound (read-only), unread
    gpu.dispatch([q, gpu.cache("k"), gpu.cache("v"), out.buffer, sinks], values, n_wg)
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"probs [{P['n_heads']}, T, S]", f"V cache [S, {P['n_kv_heads']}·{P['head_dim']}]"], (
        f"[T, {P['n_heads']}·{P['head_dim']}]"
    )


def _with_keys(keys: str, decode: str = "attn_ctx_decode"):
    """The context kernel with a key range (masked or every key): tiles of tokens reading V as a
    texture in a prefill, one vec4 of dims a thread reading the cache buffer in a decode step (T = 1),
    its keys walked by one thread (attn_ctx_decode) or split over 32 (attn_ctx_decode_wide)."""

    def pick(shape: PassShape) -> str:
        if shape.T == 1:
            return compose("lanes8", "attn_ctx_io", "attn_ctx_decode_unit", decode, "attn_ctx_v_buffer", keys)
        return compose("attn_ctx_io", "attn_ctx", "attn_ctx_v_texture", keys)

    return pick


def _tiled_workgroups(T: int, n_heads: int, size: int) -> int:
    return ceil_div(T, wgsl_const(wgsl_file("attn_tiled"), "TILE", 8)) * n_heads


OP = Op(
    output=lambda st, s: (s.T, st.params["n_heads"] * st.params["head_dim"]),
    name="attn_ctx",
    what="mixes the values of the visible keys, weighted by the attention probabilities",
    formula="c[t,h] = Σ_k p[h,t,k] · v[k,h/g]",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel(
            "attn_ctx",
            "masked",
            "the correct kernel (reads the probabilities): sums the keys the mask lets a query see; in a "
            "decode step one thread walks a unit's keys (the default on a CPU)",
            _with_keys("attn_ctx_keys_masked"),
            prefer="cpu",
        ),
        Kernel(
            "attn_ctx",
            "masked_wide",
            "masked, with a decode step's keys split over 32 threads a unit (the default on a real GPU: one "
            "thread a unit took 126 us a layer at 512 keys on an H200)",
            _with_keys("attn_ctx_keys_masked", "attn_ctx_decode_wide"),
            prefer="gpu",
        ),
        Kernel(
            "attn_ctx",
            "every_key",
            "sums every key, masked ones too (0 · inf = NaN there, as ggml's unfused mul_mat gives)",
            _with_keys("attn_ctx_keys_every"),
        ),
        Kernel(
            "attn_ctx",
            "streaming",
            "fused online-softmax attention: scores/probs are not materialized",
            from_file("attn_streaming"),
            reads=(2,),
        ),
        Kernel(
            "attn_ctx",
            "tiled",
            "fused attention, one workgroup per 8 queries of a head (TILE in the WGSL), keys in chunks of 64",
            from_file("attn_tiled"),
            reads=(2,),
            workgroups=_tiled_workgroups,
        ),
    ),
    policies=(
        Policy("attn_workgroups", "default", "the fused kernel's own workgroup count"),
        Policy(
            "attn_workgroups",
            "streaming_count",
            "a fused tier dispatched with the streaming count (T x heads workgroups): on the tiled tier the extra "
            "workgroups find no head and return, so the numbers do not change (000, phase 2)",
            faulty=True,
            workgroups=lambda T, n_heads, size: T * n_heads,
        ),
        *attn_scores.KV_SEQUENCE,
    ),
    step_fields=("n_keys", "n_past"),
)
