"""attn_scores: how much each query attends to each key, before the softmax.

Scores are q·k times a scale (1/sqrt(head_dim)), soft-capped on Gemma 2, with -inf where the
key is in the future (causal mask) or beyond the sliding window. Keys come from this layer's
KV cache (the stage's `kv_read`), so a decode step sees every earlier position. The default
kernel has two paths, as the engine of post-mortem 000 did: a prefill kernel for a fresh
prompt and a decode kernel for one new token; `decode_uses_prefill` is that engine's bug."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, PassShape, Policy, ceil_div, compose, wgsl_const

PARAMS = Params(
    T="u32",
    n_keys="u32",
    n_past="u32",
    n_heads="u32",
    n_kv_heads="u32",
    head_dim="u32",
    window="u32",
    scale="f32",
    softcap="f32",
    sinks="u32",  # the fused attention tiers: whether SINKS holds a logit per head (gpt-oss)
)


def attention_mask(T: int, n_past: int, window: int | None) -> np.ndarray:
    """True where query t (at position n_past+t) may see key position s (llama.cpp's rule)."""
    qpos = n_past + np.arange(T)[:, None]
    kpos = np.arange(n_past + T)[None, :]
    allowed = kpos <= qpos
    if window:
        allowed &= (qpos - kpos) < window
    return allowed


def scores(q, k_all, n_past: int, n_heads: int, n_kv_heads: int, head_dim: int, scale, window, softcap=0.0):
    """[heads, T, n_past+T] scaled (and capped) q·k with the causal/sliding mask as -inf."""
    T, S = q.shape[0], k_all.shape[0]
    qh = q.reshape(T, n_heads, head_dim).transpose(1, 0, 2)
    kh = np.repeat(k_all.reshape(S, n_kv_heads, head_dim).transpose(1, 0, 2), n_heads // n_kv_heads, axis=0)
    s = np.einsum("htd,hsd->hts", qh, kh) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    return np.where(attention_mask(T, n_past, window)[None], s, -np.inf)


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    return scores(
        ref.x[0],
        ref.cached("k"),
        ref.n_past,
        P["n_heads"],
        P["n_kv_heads"],
        P["head_dim"],
        P["scale"],
        P["window"],
        P["softcap"],
    )


def uniforms(stage, T: int, n_past: int) -> dict:
    """The Params values shared by the scores kernels and the fused attention tiers."""
    P = stage.params
    names = ("n_heads", "n_kv_heads", "head_dim", "scale", "softcap")
    return {"T": T, "n_keys": n_past + T, "n_past": n_past, "window": P["window"] or 0,
            "sinks": int(bool(P.get("sinks"))), **{k: P[k] for k in names}}  # fmt: skip


def workgroups(n_scores: int) -> int:
    return ceil_div(n_scores, 64)


def head_groups(source: str, n_heads: int, n_kv_heads: int) -> int:
    """The query heads a kernel's threads split: each head, or for a kernel declaring
    HEADS_PER_THREAD, groups of that many heads that share a KV head."""
    per_thread = wgsl_const(source, "HEADS_PER_THREAD", 0)
    if not per_thread:
        return n_heads
    return n_kv_heads * ceil_div(n_heads // n_kv_heads, per_thread)


def tiled_workgroups(source: str, n_heads: int, T: int, n_keys: int, n_kv_heads: int) -> int:
    """64-thread workgroups for one thread per TILE_Q x TILE_K scores of a head (a kernel without
    the constants: one thread per score); for a kernel declaring KEYS_PER_WG, one workgroup per
    that many keys of a group of heads (`head_groups`), and per QUERIES_PER_WG queries where it
    declares that (the prefill kernel's tile)."""
    keys_per_wg = wgsl_const(source, "KEYS_PER_WG", 0)
    if keys_per_wg:
        queries_per_wg = wgsl_const(source, "QUERIES_PER_WG", 0)
        query_wgs = ceil_div(T, queries_per_wg) if queries_per_wg else 1
        return head_groups(source, n_heads, n_kv_heads) * query_wgs * ceil_div(n_keys, keys_per_wg)
    tq, tk = wgsl_const(source, "TILE_Q", 1), wgsl_const(source, "TILE_K", 1)
    return ceil_div(n_heads * ceil_div(T, tq) * ceil_div(n_keys, tk), 64)


def plan(stage, gpu):
    q = gpu.input(0)
    n_keys = gpu.n_past + gpu.T
    out = gpu.output((stage.params["n_heads"], gpu.T, n_keys))
    P = stage.params
    src = gpu.kernel.source(PassShape(gpu.T, gpu.n_past))
    n_wg = tiled_workgroups(src, P["n_heads"], gpu.T, n_keys, P["n_kv_heads"])
    qw, kw = P["n_heads"] * P["head_dim"], P["n_kv_heads"] * P["head_dim"]
    # buffers, or textures where the kernel reads them as textures (the prefill kernel)
    operands = [gpu.rows(q.buffer, q.offset, qw, qw, gpu.T), gpu.rows(gpu.cache("k"), 0, kw, kw, n_keys)]
    gpu.dispatch([*operands, out.buffer], uniforms(stage, gpu.T, gpu.n_past), n_wg)
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"q [T, {P['n_heads']}·{P['head_dim']}]", f"K cache [S, {P['n_kv_heads']}·{P['head_dim']}]"], (
        f"[{P['n_heads']}, T, S]"
    )


GENERAL = ("attn_scores", "attn_mask")  # the general kernel and its mask
DECODE = ("lanes8", "attn_scores_decode")  # the decode kernel, after the lane sharing it uses
PREFILL = ("quad_step16", "attn_scores_prefill")  # the prefill kernel, after the tile step it shares with the matmul
PREFILL_SHORT = ("attn_scores_prefill_short",)  # a prompt shorter than the prefill tile (PREFILL_TILE)
PREFILL_TILE = wgsl_const(compose(*PREFILL), "QUERIES_PER_WG", 16)  # the prefill kernel's queries a workgroup


def _paths(prefill: tuple[str, ...], decode: tuple[str, ...], general: tuple[str, ...] = GENERAL,
           prefill_short: tuple[str, ...] = PREFILL_SHORT):  # fmt: skip
    """The kernel by pass shape, each a tuple of files composed in order: `prefill` for a fresh
    prompt (`prefill_short` below PREFILL_TILE tokens), `decode` for one new token, `general` for
    several new tokens after cached ones."""

    def pick(shape: PassShape) -> str:
        if shape.n_past == 0:
            return compose(*(prefill if shape.T >= PREFILL_TILE else prefill_short))
        return compose(*(decode if shape.T == 1 else general))

    return pick


def _general(shape: PassShape) -> str:
    return compose(*GENERAL)


TEXTURE_TEXELS = 8192  # WebGPU's guaranteed max-texture-dimension-2d: a prefill kernel's query row must fit one


def stage_default(stage) -> tuple[str, str] | None:
    """The buffer kernel ("general") where the queries' rows are too wide for the prefill kernel's texture:
    DeepSeek-V3's absorbed queries are 128 heads of 576 values, 18432 texels a row."""
    texels = stage.params["n_heads"] * stage.params["head_dim"] // 4
    if texels <= TEXTURE_TEXELS:
        return None
    return "general", f"default: query rows of {texels} texels pass WebGPU's {TEXTURE_TEXELS}; read from a buffer"


# Which sequence's cache each sequence of a batch reads: its own, or (a fault) the one packed before it.
KV_SEQUENCE = (
    Policy("kv_sequence", "default", "each sequence of a batch reads its own KV cache"),
    Policy(
        "kv_sequence",
        "previous_sequence",
        "in a batch, each sequence after the first attends to the keys and values of the sequence packed before "
        "it (LMCache/LMCache#4385 and waybarrios/vllm-mlx#775: requests served with other requests' KV cache); a "
        "single sequence has no other, so only a batch shows it",
        faulty=True,
        cache_of=lambda k: max(k - 1, 0),
    ),
)


OP = Op(
    output=lambda st, s: (st.params["n_heads"], s.T, s.n_past + s.T),
    layout="heads",
    name="attn_scores",
    what="scores every (query, key) pair: scaled dot products, masked to the past (and the window)",
    formula="s[h,t,k] = scale · q[t,h] · k[k,h/g]   (−inf where k > pos(t) or pos(t) − k ≥ window)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel(
            "attn_scores",
            "default",
            "prefill kernel for a fresh prompt, decode kernel for one new token",
            _paths(PREFILL, DECODE),
        ),
        Kernel("attn_scores", "general", "one kernel for every pass shape (reads n_past)", _general),
        Kernel(
            "attn_scores",
            "decode_uses_prefill",
            "decode runs the prefill kernel, which assumes no cached positions: the new token attends to "
            "position 0 only (000, phase 1)",
            _paths(PREFILL_SHORT, PREFILL_SHORT, PREFILL_SHORT),  # the prefill kernel of any prompt length
            faulty=True,
        ),
        Kernel(
            "attn_scores",
            "chunk_mask_from_zero",
            "a micro-batch after the first masks as if it started at position 0: its queries see the oldest "
            "cached keys, not their own (lablup/mlxcel #885); only a chunked or continued prompt shows it",
            _paths(PREFILL, DECODE, general=("attn_scores", "attn_mask_chunk_local")),
            faulty=True,
        ),
        Kernel(
            "attn_scores",
            "window_from_chunk_start",
            "a micro-batch after the first applies the sliding window within the chunk only, so its queries see "
            "every cached key (pytorch/executorch #21857); only a chunked or continued prompt past a window shows it",
            _paths(PREFILL, DECODE, general=("attn_scores", "attn_mask_window_from_chunk")),
            faulty=True,
        ),
        Kernel(
            "attn_scores",
            "window_off_by_one",
            "the sliding window keeps one key too many (> where >= was meant): diverges only on prompts "
            "longer than a layer's window, and never on a model without one",
            lambda shape: compose("attn_scores", "attn_mask_window_off_by_one"),
            faulty=True,
        ),
    ),
    policies=KV_SEQUENCE,
    stage_default=stage_default,
    step_fields=("n_keys", "n_past"),
    step_workgroups=lambda st, source, T, n_past: tiled_workgroups(
        source, st.params["n_heads"], T, n_past + T, st.params["n_kv_heads"]
    ),
)
