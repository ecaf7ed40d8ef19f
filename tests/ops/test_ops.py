"""Every op of the registry, every kernel and dispatch-policy variant, on fresh random data.

Generated the way ggml's tests/test-backend-ops.cpp generates its cases: per op, random shapes
with odd sizes and chunk edges, and a max NMSE per op. Each case runs the op's own `plan` on
the real wgpu device (a small harness stands in for the executor: real buffers, the kernel's
uniform packed by field name) and is compared with the op's float64 `reference`, whose weights
come from `gguf.quants.dequantize`, the independent oracle. A correct variant must pass every
case; a faulty one must fail every case marked as exposing it, and each fault has such a case.
Adding an op or a variant without cases here fails `test_every_op_and_variant_has_cases`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import wgpu
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from labkit.gpu.op_harness import run_stage, run_stage_states
from labkit.model.graph import Stage
from labkit.model.tiny import encode_tensor
from labkit.ops import OPS, attn_scores, softmax
from labkit.ops.base import Kernel
from labkit.ops.matmul import FAULTY_READERS
from labkit.ops.registry import get_kernel, get_policy
from labkit.quant.formats import FORMATS_LIST

SEED = int(np.random.SeedSequence().entropy % 2**32)  # fresh per session; in every failure message
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
Q = GGMLQuantizationType

# max NMSE per op on f32 kernels against float64 (ggml's per-op max_nmse)
NMSE = {
    "embed": 1e-12,
    "rmsnorm": 1e-10,
    "matmul": 1e-9,
    "rope": 1e-8,  # f32 angles at positions in the hundreds
    "attn_scores": 1e-10,
    "softmax": 1e-10,
    "attn_ctx": 1e-10,
    "add": 1e-12,
    "glu": 1e-10,
    "softcap": 1e-10,
    "moe_router": 1e-10,  # ids compare exactly: any differing id is an NMSE far above this
    "moe_matmul": 1e-9,
    "moe_sum": 1e-12,
    "mul": 1e-12,
    "add_id": 1e-12,
    # Mamba-2's mixer: each state-advancing op is compared on its output and on the state it leaves
    "ssm_conv": 1e-10,
    "ssm_scan": 1e-9,  # f32 state over tens of tokens
    "ssm_skip": 1e-12,
    "gated_norm": 1e-10,
    "state": 1e-12,
    "scale": 1e-12,
    # the gated delta net's (Qwen3.5): its rule compared on its output and the memory it leaves
    "columns": 1e-12,
    "attn_gate": 1e-12,
    "sigmoid": 1e-12,
    "delta_decay": 1e-12,
    "l2norm": 1e-10,
    "delta_net": 1e-9,  # f32 memory over tens of tokens
    "gated_add": 1e-12,
    "relu_sqr": 1e-12,
    # DeepSeek's latent attention: per-head matrices (the experts' kernels), rows joined per head
    "head_matmul": 1e-9,
    "concat": 1e-12,
    # a cache of a smaller type: ggml's rounding bit for bit (one value rounded the other way is ~1e-5)
    "kv_cache": 1e-12,
    "hadamard": 1e-12,
    "argmax": 0.0,  # ids: exact
}
# faults that are harmless by design: post-mortem 000's "fix that changed nothing"
HARMLESS = {("attn_workgroups", "streaming_count")}
# faults no single-sequence case can show: tests/test_batch.py exposes them in a batch
BATCH_ONLY = {("kv_sequence", "previous_sequence")}
POLICY_KERNEL = {"attn_workgroups": "tiled"}  # the kernel a policy is tried with


@dataclass
class OpCase:
    """One generated case: a stage, its input arrays, its weights (GGUF bytes), its KV cache."""

    label: str
    stage: Stage
    inputs: list[np.ndarray]
    T: int
    n_past: int = 0
    weights: dict[str, tuple[np.ndarray, Q, tuple[int, int]]] = field(default_factory=dict)
    cache: dict[str, np.ndarray] = field(default_factory=dict)  # "k"/"v": [capacity, kv_dim]
    ids: np.ndarray | None = None
    exposes: frozenset[str] = frozenset()  # faulty variants that must fail on this case
    window_bytes: int | None = None

    def weight(self, name: str) -> np.ndarray:
        raw, qtype, shape = self.weights[name]
        return gguf_dequantize(raw, qtype).reshape(shape).astype(np.float64)


# ----------------------------------------------------------------- the generated cases
def _rng(op: str) -> np.random.Generator:
    return np.random.default_rng([SEED, sum(map(ord, op))])


def _vector(case_weights: dict, name: str, values: np.ndarray) -> str:
    case_weights[name] = (values.astype(np.float32), Q.F32, (1, values.size))
    return name


def _weight(rng, case_weights: dict, name: str, rows: int, cols: int, type_name: str, scale: float = 0.1) -> str:
    raw, qtype = encode_tensor(rng, rng.standard_normal((rows, cols)).astype(np.float32) * scale, type_name)
    case_weights[name] = (np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1), qtype, (rows, cols))
    return name


def cases_embed() -> list[OpCase]:
    r, out = _rng("embed"), []
    for vocab, d, wt in ((37, 96, "F32"), (53, 128, "Q8_0"), (11, 32, "Q4_0")):
        w: dict = {}
        name = _weight(r, w, "token_embd.weight", vocab, d, wt, 1.0)
        ids = r.integers(0, vocab, size=int(r.integers(1, 9)))
        st = Stage("embed", "embed", (), name, params={"scale": float(r.uniform(0.5, 30)), "d_model": d})
        out.append(OpCase(f"{wt} V{vocab} d{d}", st, [], len(ids), weights=w, ids=ids))
    return out


def cases_rmsnorm() -> list[OpCase]:
    r, out = _rng("rmsnorm"), []
    for n_groups, group, mag in ((1, 640, 1.0), (7, 64, 30.0), (5, 37, 0.2), (3, 256, 1e-4), (2, 4099, 3.0)):
        w: dict = {}
        name = _vector(w, "norm.weight", 1.0 + 0.1 * r.standard_normal(group))
        x = r.standard_normal((n_groups, group)) * mag
        st = Stage("n", "rmsnorm", ("x",), name, params={"eps": 1e-6, "group": group, "width": group})
        shows = {"scale_clamp", "offset_twice"} | ({"eps_outside"} if mag < 1e-3 else set())
        out.append(OpCase(f"{n_groups}x{group} |x|~{mag:g}", st, [x], n_groups, weights=w, exposes=frozenset(shows)))
    return out


FAULTS_BY_FORMAT = {fmt: frozenset(n for f, n, _ in FAULTY_READERS if f == fmt) for fmt, _, _ in FAULTY_READERS}


def cases_matmul() -> list[OpCase]:
    """Every GGUF type labkit reads, at a decode step (T = 1: the matvec drivers) and a prefill (the
    tiled ones), K two blocks wide (or 512), rows past a quad; its faulty readers must show on both."""
    r, out = _rng("matmul"), []
    for fmt in FORMATS_LIST:
        K = max(2 * fmt.block_size, 256 if fmt.block_size < 256 else 512)
        for T, N in ((1, 67), (9, 130)):
            w: dict = {}
            name = _weight(r, w, "w.weight", N, K, fmt.type_name)
            st = Stage("y", "matmul", ("x",), name, params={"out": N, "in": K, "width": N})
            exposes = FAULTS_BY_FORMAT.get(fmt.name, frozenset())
            x = r.standard_normal((T, K))
            out.append(OpCase(f"{fmt.type_name} T{T} K{K} N{N}", st, [x], T, weights=w, exposes=exposes))
    # wg_tile's prefill tiles: two of 64 tokens, a third row tile, and an F16 row of odd width (values past K)
    for wt, T, K, N in (("Q4_K", 70, 512, 130), ("F16", 70, 37, 65)):
        w = {}
        name = _weight(r, w, "w.weight", N, K, wt)
        st = Stage("y", "matmul", ("x",), name, params={"out": N, "in": K, "width": N})
        out.append(OpCase(f"{wt} T{T} K{K} N{N}", st, [r.standard_normal((T, K))], T, weights=w))
    # the unembedding: its weight in row windows (a small window size), the lm_head policy applies
    w = {}
    name = _weight(r, w, "head.weight", 200, 64, "Q8_0")
    st = Stage("logits", "matmul", ("x",), name, params={"out": 200, "in": 64, "width": 200}, policy="lm_head")
    out.append(
        OpCase(
            "lm_head in 4 windows",
            st,
            [r.standard_normal((3, 64))],
            3,
            weights=w,
            window_bytes=68 * 52,
            exposes=frozenset({"skip_last_window"}),
        )  # fmt: skip
    )
    # a row range of a fused weight (phi3's gate half of ffn_up), with a bias
    w = {}
    name = _weight(r, w, "fused.weight", 96, 64, "Q8_0")
    bias = _vector(w, "fused.bias", r.standard_normal(48))
    st = Stage("g", "matmul", ("x",), name, bias, params={"out": 48, "in": 64, "width": 48}, weight_rows=(48, 96))
    out.append(OpCase("rows 48:96 + bias", st, [r.standard_normal((4, 64))], 4, weights=w))
    return out


def cases_rope() -> list[OpCase]:
    r, out = _rng("rope"), []
    for T, H, hd, rope_dim, n_past, base, style, into_cache in (
        (7, 4, 256, 256, 0, 1e6, "neox", False),
        (3, 9, 64, 64, 11, 1e5, "normal", False),
        (1, 1, 256, 256, 517, 1e4, "neox", True),  # a decode step's key, written into the cache at n_past
        (5, 3, 64, 32, 2, 1e4, "neox", True),  # partial rotary dims
    ):
        params = {"n_heads": H, "head_dim": hd, "rope_dim": rope_dim, "base": base, "style": style}
        st = Stage("r", "rope", ("x",), params=params, layer=0, kv_write="k" if into_cache else None)
        cache = {"k": np.full((n_past + T + 2, H * hd), np.nan)} if into_cache else {}
        restart = {"positions_restart"} if n_past and T > 1 else set()  # a micro-batch after cached positions
        shows = frozenset(({"normal_pairs"} if style == "neox" else {"neox_pairs"}) | restart)
        x = r.standard_normal((T, H * hd))
        out.append(OpCase(f"{style} T{T} pos0 {n_past}", st, [x], T, n_past, cache=cache, exposes=shows))
    # scaled: linear (angles / 4), and YaRN as gpt-oss's files ask it (factor 32 over 4096 positions: dims
    # 10..23 of 64 ramp from the unscaled angle to the scaled one, cos and sin times 1 + 0.1·ln 32)
    for style, n_past, scaling in (
        ("neox", 300, {"freq_scale": 0.25, "ext_factor": 0.0, "attn_factor": 1.0, "corr_dims": (0.0, 0.0)}),
        ("neox", 2000, {"freq_scale": 1 / 32, "ext_factor": 1.0, "attn_factor": 1.0, "corr_dims": (10.0, 23.0)}),
        ("normal", 9, {"freq_scale": 1 / 8, "ext_factor": 1.0, "attn_factor": 0.9, "corr_dims": (3.0, 5.0)}),
    ):
        params = {"n_heads": 3, "head_dim": 64, "rope_dim": 64, "base": 1.5e5, "style": style, **scaling}
        st = Stage("r", "rope", ("x",), params=params, layer=0)
        shows = {"normal_pairs", "positions_restart"} if style == "neox" else {"neox_pairs", "positions_restart"}
        shows = frozenset(shows | ({"yarn_uncancelled"} if scaling["ext_factor"] else set()))
        x = r.standard_normal((4, 3 * 64))
        out.append(OpCase(f"{style} scaled x{1 / scaling['freq_scale']:g} ext {scaling['ext_factor']:g} pos0 {n_past}",
                          st, [x], 4, n_past, exposes=shows))  # fmt: skip
    # llama3's per-pair factors (rope_freqs.weight), into the cache at n_past
    w: dict = {}
    factors = _vector(w, "rope_freqs.weight", np.where(np.arange(32) < 10, 1.0, r.uniform(1.0, 8.0, 32)))
    params = {"n_heads": 2, "head_dim": 64, "rope_dim": 64, "base": 5e5, "style": "normal", "freq_factors": factors}
    st = Stage("r", "rope", ("x",), params=params, layer=0, kv_write="k")
    cache = {"k": np.full((40, 2 * 64), np.nan)}
    out.append(OpCase("normal rope_freqs T3 pos0 30", st, [r.standard_normal((3, 128))], 3, 30, weights=w, cache=cache,
                      exposes=frozenset({"positions_restart", "neox_pairs"})))  # fmt: skip
    return out


def _attention_case(r, op: str, T, n_past, H, KV, hd, window, cap, sinks: bool = False) -> OpCase:
    """With `sinks` (gpt-oss), each head's sink logit: in the probabilities the unfused kernel reads,
    and in the SINKS buffer the fused tiers read."""
    S = n_past + T
    q = r.standard_normal((T, H * hd))
    cache = {"k": r.standard_normal((S + 2, KV * hd)), "v": r.standard_normal((S + 2, KV * hd))}
    params = {"n_heads": H, "n_kv_heads": KV, "head_dim": hd, "scale": 1 / np.sqrt(hd), "window": window,
              "softcap": cap}  # fmt: skip
    shows = {"decode_uses_prefill"} if n_past else set()
    if window and n_past + T > window:  # some query is `window` or more past a key
        shows.add("window_off_by_one")
    if n_past and T > 1:  # several new tokens after cached ones: the general kernel, a chunk's
        shows.add("chunk_mask_from_zero")
        if window and n_past + T > window:  # a query of the chunk is a window or more past a cached key
            shows.add("window_from_chunk_start")
    shows = frozenset(shows)
    label = f"T{T} past{n_past} H{H}/{KV} hd{hd} win{window} cap{cap}"
    if op == "attn_scores":
        st = Stage("s", "attn_scores", ("q", "k"), params=params, layer=0, kv_read=("k",))
        return OpCase(label, st, [q, q[:0]], T, n_past, cache=cache, exposes=shows)
    s = attn_scores.scores(q, cache["k"][:S], n_past, H, KV, hd, params["scale"], window, cap)
    w: dict = {}
    p = softmax.softmax(s)
    if sinks:
        params["sinks"] = _vector(w, "attn_sinks.weight", r.standard_normal(H) * 2.0)
        p = softmax.with_sinks(s, w["attn_sinks.weight"][0].ravel())
        label += " sinks"
    st = Stage("c", "attn_ctx", ("p", "v", "q"), params=params, layer=0, kv_read=("k", "v"))
    return OpCase(label, st, [p, q[:0], q], T, n_past, cache=cache, weights=w)


ATTENTION_SHAPES = (
    (7, 0, 4, 1, 256, None, 0.0),
    (1, 9, 9, 3, 64, None, 0.0),
    (9, 3, 4, 2, 32, 4, 0.0),
    (9, 70, 4, 1, 256, None, 0.0),  # 79 keys: two key chunks of the tiled kernel, two query tiles
    (17, 60, 2, 1, 48, 40, 0.0),  # a partial tile, a window across the chunk edge, head_dim % 64 != 0
    (6, 2, 4, 2, 64, 5, 2.5),  # gemma2: scores soft-capped before the mask
    (170, 0, 2, 1, 32, 20, 0.0),  # prefill: 2 key workgroups of the scores tile, one wholly before the window
    (1, 40, 14, 2, 96, None, 0.0),  # decode: 7 heads a KV head (groups of 4 and 3)
    (1, 299, 8, 2, 64, 97, 0.0),  # decode: 300 keys in a window of 97, over the wide driver's 32 slices
    (1, 36, 8, 8, 40, 19, 2.5),  # decode: one head a KV head, head_dim % 32 != 0, capped, in a window
)


def cases_attn_scores() -> list[OpCase]:
    r = _rng("attn_scores")
    return [_attention_case(r, "attn_scores", *shape) for shape in ATTENTION_SHAPES]


SINK_SHAPES = (ATTENTION_SHAPES[1], ATTENTION_SHAPES[2], ATTENTION_SHAPES[3])  # decode, a window, two chunks


def cases_attn_ctx() -> list[OpCase]:
    r = _rng("attn_ctx")
    plain = [_attention_case(r, "attn_ctx", *shape) for shape in ATTENTION_SHAPES]
    return plain + [_attention_case(r, "attn_ctx", *shape, sinks=True) for shape in SINK_SHAPES]


def cases_softmax() -> list[OpCase]:
    r, out = _rng("softmax"), []
    for rows, n, mag, masked_row in ((3, 5, 1.0, False), (4, 300, 200.0, False), (2, 77, 3.0, True)):
        x = r.standard_normal((rows, n)) * mag
        x[:, n // 2 :] = np.where(r.random((rows, n - n // 2)) < 0.3, -np.inf, x[:, n // 2 :])
        if masked_row:
            x[-1] = -np.inf
        st = Stage("p", "softmax", ("s",), params={"n_heads": 1})
        shows = frozenset({"no_max_sub"} if mag > 100 else {"masked_nan"} if masked_row else ())
        out.append(OpCase(f"{rows}x{n} |x|~{mag:g} masked_row={masked_row}", st, [x], rows, exposes=shows))
    for H, T, S, mag in ((3, 5, 9, 2.0), (2, 4, 70, 200.0)):  # gpt-oss: a sink logit per head, rows masked
        x = r.standard_normal((H, T, S)) * mag
        x[:, :, S // 2 :] = np.where(r.random((H, T, S - S // 2)) < 0.3, -np.inf, x[:, :, S // 2 :])
        x[0, -1] = -np.inf  # a row with nothing visible: the sink takes it all, its probabilities are 0
        w: dict = {}
        sinks = _vector(w, "attn_sinks.weight", r.standard_normal(H) * mag)
        st = Stage("p", "softmax", ("s",), params={"n_heads": H, "sinks": sinks})
        # masked_nan cannot show: with a sink, a row with nothing visible still has a finite max
        shows = frozenset({"no_max_sub"} if mag > 100 else ())
        out.append(OpCase(f"{H}x{T}x{S} |x|~{mag:g} sinks", st, [x], T, weights=w, exposes=shows))
    return out


def cases_add() -> list[OpCase]:
    r = _rng("add")
    return [
        OpCase(f"{n}", Stage("a", "add", ("x", "y"), params={"width": n}), [r.standard_normal((T, n)) for _ in "ab"], T)
        for T, n in ((1, 640), (7, 37), (3, 576))
    ]


def cases_glu() -> list[OpCase]:
    r, out = _rng("glu"), []
    for act, T, n in (("gelu_tanh", 3, 2048), ("silu", 5, 1539), ("swiglu_oai", 4, 1027)):
        g = r.standard_normal((T, n)) * 8
        g[0, :4] = [60.0, -60.0, 300.0, -300.0]  # tanh/exp must not overflow into NaN
        st = Stage("f", "glu", ("g", "u"), params={"act": act, "width": n})
        out.append(OpCase(f"{act} {T}x{n}", st, [g, r.standard_normal((T, n))], T))
    return out


def cases_softcap() -> list[OpCase]:
    r = _rng("softcap")
    st = Stage("l", "softcap", ("x",), params={"cap": 10.0, "width": 513})
    return [OpCase("513 cap 10", st, [r.standard_normal((2, 513)) * 30], 2)]


def _distinct_ids(r, T: int, k: int, n_expert: int) -> np.ndarray:
    return np.stack([r.permutation(n_expert)[:k] for _ in range(T)]).astype(np.int32)


def _spread(logits: np.ndarray, k: int, outside: float = 0.1) -> np.ndarray:
    """Each row's logits scaled down until the experts outside its top k keep `outside` of the
    probability: the router faults (renormalizing or not, softmax before or after top-k) differ
    by that mass, so a row where one expert took nearly all of it (one token in 8 experts, some
    seeds) hid them."""
    rows = []
    for row in logits:
        while True:
            p = np.exp(row - row.max())
            if 1 - np.sort(p / p.sum())[-k:].sum() >= outside:
                break
            row = row * 0.7
        rows.append(row)
    return np.array(rows)


def cases_moe_router() -> list[OpCase]:
    """The three results over random logits: 1 token, 70 (past one workgroup of 64), 128 experts."""
    r, out = _rng("moe_router"), []
    for T, n, k in ((1, 8, 2), (70, 128, 8), (5, 60, 4)):
        route = {"n_expert": n, "k": k}
        logits = _spread(r.standard_normal((T, n)) * 3, k)
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        st = Stage(
            "blk.0.ffn_router_probs", "moe_router", ("l",), params={**route, "out": "probs", "norm": True}, layer=0
        )
        out.append(OpCase(f"probs T{T} n{n}", st, [logits], T))
        st = Stage("blk.0.ffn_topk", "moe_router", ("p",), params={**route, "out": "ids", "norm": True}, layer=0)
        out.append(OpCase(f"ids T{T} n{n} k{k}", st, [probs], T, exposes=frozenset({"expert_index_off_by_one"})))
        ids = np.argsort(-probs, axis=1, kind="stable")[:, :k].astype(np.int32)
        for norm in (True, False):
            st = Stage("blk.0.ffn_expert_weights", "moe_router", ("p", "i"),
                       params={**route, "out": "weights", "norm": norm}, layer=0)  # fmt: skip
            shows = {"no_renormalize"} if norm else {"softmax_after_topk"}
            out.append(OpCase(f"weights T{T} n{n} k{k} norm={norm}", st, [probs, ids], T, exposes=frozenset(shows)))
        out += _biased_router_cases(r, T, n, k, probs)
        out += _deepseek_router_cases(r, T, n, k, logits) if n % 8 == 0 else []
        # gpt-oss's softmax_weight gating: the top k of the logits, a softmax over the k selected
        oss = {**route, "norm": False, "gating": "softmax_weight"}
        st = Stage("blk.0.ffn_topk", "moe_router", ("l",), params={**oss, "out": "ids"}, layer=0)
        out.append(OpCase(f"logit ids T{T} n{n} k{k}", st, [logits], T, exposes=frozenset({"expert_index_off_by_one"})))
        lids = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)
        st = Stage("blk.0.ffn_expert_weights", "moe_router", ("l", "i"), params={**oss, "out": "weights"}, layer=0)
        out.append(OpCase(f"softmax_weight T{T} n{n} k{k}", st, [logits, lids], T,
                          exposes=frozenset({"softmax_before_topk"})))  # fmt: skip
    return out


def _biased_router_cases(r, T: int, n: int, k: int, probs: np.ndarray) -> list[OpCase]:
    """A selection-only bias (ERNIE's exp_probs_b, about a probability's size): it moves the top k,
    and the weights are still the probabilities at those ids."""
    w: dict = {}
    bias = r.standard_normal(n) * 0.05
    sel = _vector(w, "blk.0.exp_probs_b.bias", bias)
    route = {"n_expert": n, "k": k, "norm": True}
    st = Stage("blk.0.ffn_topk", "moe_router", ("p",), bias=sel, params={**route, "out": "ids"}, layer=0)
    ids_case = OpCase(f"biased ids T{T} n{n} k{k}", st, [probs], T, weights=w,
                      exposes=frozenset({"expert_index_off_by_one"}))  # fmt: skip
    ids = np.argsort(-(probs + bias), axis=1, kind="stable")[:, :k].astype(np.int32)
    st = Stage("blk.0.ffn_expert_weights", "moe_router", ("p", "i"), bias=sel, params={**route, "out": "weights"},
               layer=0)  # fmt: skip
    shows = frozenset({"bias_in_weights", "no_renormalize"})
    plain = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    assert not np.array_equal(plain, ids) or T == 1, "the bias moves no token's experts: a case that cannot tell"
    return [ids_case, OpCase(f"biased weights T{T} n{n} k{k}", st, [probs, ids], T, weights=w, exposes=shows)]


def _deepseek_router_cases(r, T: int, n: int, k: int, logits: np.ndarray) -> list[OpCase]:
    """DeepSeek-V3's routing: sigmoid probabilities; the top k with a selection bias from the best half of 4
    groups (each group scored by its two best); the weights renormalized and times a routed scale."""
    w: dict = {}
    bias = r.standard_normal(n) * 0.05
    sel = _vector(w, "blk.0.exp_probs_b.bias", bias)
    route = {"n_expert": n, "k": k, "norm": True, "gating": "sigmoid", "groups": 4, "groups_used": 2, "w_scale": 2.5}
    st = Stage("blk.0.ffn_router_probs", "moe_router", ("l",), params={**route, "out": "probs"}, layer=0)
    cases = [OpCase(f"sigmoid probs T{T} n{n}", st, [logits], T)]
    probs = 1.0 / (1.0 + np.exp(-logits))
    st = Stage("blk.0.ffn_topk", "moe_router", ("p",), bias=sel, params={**route, "out": "ids"}, layer=0)
    scores = probs + bias
    g = scores.reshape(T, 4, n // 4)
    best = np.argsort(-np.sort(g, axis=-1)[..., -2:].sum(-1), axis=1, kind="stable")[:, :2]
    keep = np.zeros((T, 4), bool)
    np.put_along_axis(keep, best, True, axis=1)
    masked = np.where(keep[..., None], g, -np.inf).reshape(T, n)
    ids = np.argsort(-masked, axis=1, kind="stable")[:, :k].astype(np.int32)
    plain = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    grouped = not np.array_equal(np.sort(plain, 1), np.sort(ids, 1))
    assert grouped or T == 1, "the groups change no token's experts: a case that cannot tell"
    # the seed is fresh per process: which cases expose a fault must not depend on it (xdist collects in each)
    shows = {"expert_index_off_by_one"} | ({"groups_ignored"} if T > 1 else set())
    cases.append(OpCase(f"grouped ids T{T} n{n} k{k}", st, [probs], T, weights=w, exposes=frozenset(shows)))
    st = Stage("blk.0.ffn_expert_weights", "moe_router", ("p", "i"), bias=sel, params={**route, "out": "weights"},
               layer=0)  # fmt: skip
    shows = frozenset({"bias_in_weights", "no_renormalize", "no_routed_scale", "routed_scale_twice"})
    return [*cases, OpCase(f"scaled weights T{T} n{n} k{k}", st, [probs, ids], T, weights=w, exposes=shows)]


def cases_moe_matmul() -> list[OpCase]:
    """Every GGUF type as a 3-D expert tensor: a decode step and a prefill, the input shared by the
    slots (gate, up) or each slot's own (down), and one case whose experts span several windows."""
    r, out = _rng("moe_matmul"), []
    for fmt in FORMATS_LIST:
        K = max(fmt.block_size, 64) if fmt.block_size < 256 else 256
        for T, N, per_slot in ((1, 67, False), (9, 130, True)):
            w: dict = {}
            n_expert, k = 5, 2
            name = _weight(r, w, "exps.weight", n_expert * N, K, fmt.type_name)
            st = Stage("blk.0.ffn_moe_up", "moe_matmul", ("x", "ids"), name, layer=0,
                       params={"out": N, "in": K, "k": k, "per_slot": per_slot})  # fmt: skip
            x = r.standard_normal((T, k, K) if per_slot else (T, K))
            ids = _distinct_ids(r, T, k, n_expert)
            out.append(OpCase(f"{fmt.type_name} T{T} N{N} per_slot={per_slot}", st, [x, ids], T, weights=w))
    w = {}
    name = _weight(r, w, "exps.weight", 7 * 40, 64, "Q8_0")
    st = Stage("blk.0.ffn_moe_gate", "moe_matmul", ("x", "ids"), name, layer=0,
               params={"out": 40, "in": 64, "k": 3, "per_slot": False})  # fmt: skip
    case = [r.standard_normal((6, 64)), _distinct_ids(r, 6, 3, 7)]
    out.append(OpCase("Q8_0 7 experts in windows of 2", st, case, 6, weights=w, window_bytes=2 * 40 * 68))
    # a prefill where each expert is picked by more slots than one gathered tile holds (8)
    for fmt, per_slot in (("Q4_K", False), ("MXFP4", True)):
        w = {}
        name = _weight(r, w, "exps.weight", 3 * 260, 256, fmt)
        st = Stage("blk.0.ffn_moe_down", "moe_matmul", ("x", "ids"), name, layer=0,
                   params={"out": 260, "in": 256, "k": 2, "per_slot": per_slot})  # fmt: skip
        x = r.standard_normal((21, 2, 256) if per_slot else (21, 256))
        out.append(
            OpCase(f"{fmt} 21 tokens on 3 experts (tiles of 8)", st, [x, _distinct_ids(r, 21, 2, 3)], 21, weights=w)
        )
    return out


def cases_moe_sum() -> list[OpCase]:
    r = _rng("moe_sum")
    out = []
    for T, k, n in ((1, 2, 64), (7, 8, 129)):
        st = Stage("blk.0.ffn_moe_out", "moe_sum", ("d", "w"), params={"width": n}, layer=0)
        out.append(OpCase(f"T{T} k{k} n{n}", st, [r.standard_normal((T, k, n)), r.random((T, k))], T))
    return out


def cases_mul() -> list[OpCase]:
    r = _rng("mul")
    return [
        OpCase(
            f"{n} period {p}",
            Stage("m", "mul", ("x", "s"), params={"width": n}),
            [r.standard_normal((T, n)), r.standard_normal(p)],
            T,
        )  # fmt: skip
        for T, n, p in ((1, 640, 1), (7, 37, 37))
    ]


def cases_add_id() -> list[OpCase]:
    """Each slot's expert's bias: a decode step and a prefill, ids not in order."""
    r, out = _rng("add_id"), []
    for T, k, n, n_expert in ((1, 2, 64, 5), (7, 4, 131, 9)):
        st = Stage("blk.0.ffn_moe_up", "add_id", ("y", "b", "ids"), params={"k": k, "width": n}, layer=0)
        y, b, ids = r.standard_normal((T, k, n)), r.standard_normal((n_expert, n)), _distinct_ids(r, T, k, n_expert)
        out.append(OpCase(f"T{T} k{k} n{n}", st, [y, b, ids], T))
    return out


def cases_ssm_conv() -> list[OpCase]:
    """Odd channel counts, T below, at and above d_conv - 1 (the kept window straddles the old state),
    and a state left by an earlier pass (never zeros): the state_lag fault shows in the state it leaves."""
    r, out = _rng("ssm_conv"), []
    for T, C, k in ((1, 64, 4), (2, 70, 4), (3, 131, 4), (9, 100, 3), (33, 37, 4)):
        w: dict = {}
        weight = _vector(w, "conv.weight", r.standard_normal((C, k)) / np.sqrt(k))
        bias = _vector(w, "conv.bias", 0.1 * r.standard_normal(C))
        P = {"channels": C, "d_conv": k, "out": C}
        st = Stage("blk.0.ssm_conv", "ssm_conv", ("x",), weight, bias, params=P, layer=0, state="conv")
        cache = {"conv": r.standard_normal((C, k - 1))}
        case = OpCase(f"T{T} c{C} k{k}", st, [r.standard_normal((T, C)) * 2], T, weights=w, cache=cache)
        out.append(replace(case, exposes=frozenset({"state_lag"})))
    # the gated delta net's conv: no bias
    P = {"channels": 96, "d_conv": 4, "out": 96}
    w: dict = {}
    weight = _vector(w, "conv.weight", r.standard_normal((96, 4)) / 2)
    st = Stage("blk.0.ssm_conv", "ssm_conv", ("x",), weight, params=P, layer=0, state="conv")
    cache = {"conv": r.standard_normal((96, 3))}
    out.append(OpCase("T5 c96 k4 no bias", st, [r.standard_normal((5, 96))], 5, weights=w, cache=cache,
                      exposes=frozenset({"state_lag"})))  # fmt: skip
    return out


def _scan_inputs(r, T: int, H: int, hd: int, N: int, G: int):
    x = r.standard_normal((T, H * hd + 2 * G * N))
    dt = r.standard_normal((T, H)) * 2 - 1
    dt[0, 0] = 25.0  # softplus's linear branch (ggml's: above 20 as it is)
    return x, dt


def cases_ssm_scan() -> list[OpCase]:
    """Heads sharing B and C in groups, odd head and state sizes, prompts within one of the GPU's chunks of
    16, at its edge and across several (a partial last chunk), past the reference's chunk of 64, a decode step;
    a state never zero. The chunk_boundary fault shows once a prompt spans two chunks."""
    r, out = _rng("ssm_scan"), []
    cases = (
        (1, 4, 16, 16, 2),
        (9, 6, 8, 12, 3),
        (16, 2, 8, 8, 1),
        (40, 2, 32, 64, 1),
        (5, 8, 7, 5, 4),
        (70, 2, 4, 8, 2),
    )
    for T, H, hd, N, G in cases:
        w: dict = {}
        A = _vector(w, "blk.0.ssm_a", -r.uniform(0.5, 8.0, H))
        P = {"n_head": H, "d_inner": H * hd, "d_state": N, "n_group": G, "channels": H * hd + 2 * G * N}
        st = Stage("blk.0.ssm_scan", "ssm_scan", ("xbc", "dt"), A, params=P, layer=0, state="scan")
        cache = {"scan": r.standard_normal((H, hd, N))}
        # over tens of tokens a decaying state forgets where it started: the reset shows in short passes (by
        # 16 tokens a fast decay, A near -8, left it at NMSE 1.3e-9 on one seed: not a reliable 100x); within one
        # chunk a chunk boundary changes nothing; across them the dropped state shows (its decay is slower than
        # the reset's: every chunk after the first starts from zero)
        reset = {"state_reset"} if T <= 9 else set()
        shows = frozenset({"no_softplus", "a_positive"} | reset | ({"chunk_boundary"} if T > 16 else set()))
        label = f"T{T} H{H} hd{hd} N{N} G{G}"
        out.append(OpCase(label, st, list(_scan_inputs(r, T, H, hd, N, G)), T, weights=w, cache=cache, exposes=shows))
    return out


def cases_ssm_skip() -> list[OpCase]:
    r, out = _rng("ssm_skip"), []
    for T, H, hd, extra in ((1, 4, 16, 64), (7, 3, 37, 10)):
        w: dict = {}
        D = _vector(w, "blk.0.ssm_d", 1.0 + 0.1 * r.standard_normal(H))
        P = {"n_head": H, "d_inner": H * hd, "channels": H * hd + extra}
        st = Stage("blk.0.ssm_skip", "ssm_skip", ("y", "xbc"), D, params=P, layer=0)
        xs = [r.standard_normal((T, H * hd)), r.standard_normal((T, H * hd + extra))]
        out.append(OpCase(f"T{T} H{H} hd{hd}", st, xs, T, weights=w))
    return out


def cases_gated_norm() -> list[OpCase]:
    """The gate before the norm (Mamba-2) and after it (Qwen3-Next); one weight row per group or shared."""
    r, out = _rng("gated_norm"), []
    for T, group, n_group, gate, shared in ((1, 128, 2, "before", False), (5, 37, 3, "before", False),
                                             (3, 64, 4, "after", True), (2, 1000, 1, "after", False)):  # fmt: skip
        w: dict = {}
        norm = _vector(w, "norm.weight", 1.0 + 0.1 * r.standard_normal(group if shared else group * n_group))
        P = {"eps": 1e-5, "group": group, "width": group * n_group, "gate": gate, "w_groups": 1 if shared else n_group}
        st = Stage("blk.0.ssm_norm", "gated_norm", ("y", "z"), norm, params=P, layer=0)
        xs = [r.standard_normal((T, group * n_group)) * 3, r.standard_normal((T, group * n_group)) * 2]
        out.append(OpCase(f"{gate} T{T} {n_group}x{group}", st, xs, T, weights=w, exposes=frozenset({"gate_swapped"})))
    return out


def cases_scale() -> list[OpCase]:
    r = _rng("scale")
    st = Stage("logits", "scale", ("logits_raw",), params={"scale": 1 / 6, "width": 515})
    return [OpCase("2x515 by 1/6", st, [r.standard_normal((2, 515)) * 20], 2)]


def cases_state() -> list[OpCase]:
    r = _rng("state")
    st = Stage("blk.0.scan_state", "state", ("blk.0.ssm_scan",), params={"size": 777}, layer=0, state="scan")
    return [OpCase("777 floats", st, [np.zeros((3, 4))], 3, cache={"scan": r.standard_normal(777)})]


def cases_columns() -> list[OpCase]:
    """Each head's query out of q_full (head_dim wide, every 2·head_dim), odd widths and offsets."""
    r, out = _rng("columns"), []
    for T, groups, width, step, offset in ((1, 4, 64, 128, 0), (5, 3, 37, 80, 5)):
        P = {"groups": groups, "width": width, "step": step, "offset": offset, "in": groups * step}
        st = Stage("blk.0.q", "columns", ("q_full",), params=P, layer=0)
        shows = frozenset({"rotary_first"} if offset else set())
        x = r.standard_normal((T, groups * step))
        out.append(OpCase(f"T{T} {groups}x{width}/{step}+{offset}", st, [x], T, exposes=shows))
    return out


def cases_concat() -> list[OpCase]:
    """Each head's absorbed query and rotated part (4 heads), and a token's latent and rotary key at odd widths."""
    r, out = _rng("concat"), []
    for T, g, wa, wb in ((1, 4, 64, 32), (7, 1, 37, 11), (5, 3, 20, 6)):
        st = Stage("blk.0.q_mla", "concat", ("a", "b"), params={"groups": g, "widths": (wa, wb)}, layer=0)
        xs = [r.standard_normal((T, g * wa)), r.standard_normal((T, g * wb))]
        out.append(OpCase(f"T{T} {g}x({wa}+{wb})", st, xs, T))
    return out


def cases_head_matmul() -> list[OpCase]:
    """Each head's slice times its own matrix (attn_k_b, attn_v_b): a decode step and a prefill (the slots
    gathered per head), an odd row count, in the formats DeepSeek files carry them in and a K-quant."""
    r, out = _rng("head_matmul"), []
    for type_name, K in (("F32", 64), ("F16", 64), ("Q8_0", 96), ("Q4_K", 256)):
        for T, H, N in ((1, 4, 67), (9, 3, 130)):
            w: dict = {}
            name = _weight(r, w, "blk.0.attn_k_b.weight", H * N, K, type_name)
            st = Stage("blk.0.q_absorbed", "head_matmul", ("x",), name, layer=0, params={"heads": H, "out": N, "in": K})
            out.append(OpCase(f"{type_name} T{T} H{H} N{N} K{K}", st, [r.standard_normal((T, H * K))], T, weights=w))
    return out


def cases_attn_gate() -> list[OpCase]:
    r, out = _rng("attn_gate"), []
    for T, H, d in ((1, 4, 64), (7, 3, 37)):
        st = Stage("blk.0.attn_gated", "attn_gate", ("ctx", "q_full"), params={"n_heads": H, "head_dim": d}, layer=0)
        xs = [r.standard_normal((T, H * d)), r.standard_normal((T, 2 * H * d)) * 3]
        out.append(OpCase(f"T{T} H{H} d{d}", st, xs, T))
    return out


def cases_sigmoid() -> list[OpCase]:
    r = _rng("sigmoid")
    st = Stage("blk.0.ssm_beta", "sigmoid", ("ssm_b",), params={"width": 13}, layer=0)
    return [OpCase("3x13", st, [r.standard_normal((3, 13)) * 4], 3)]


def cases_delta_decay() -> list[OpCase]:
    """alpha around 0 with a dt_bias in softplus's curved range (every fault changes g), and one value in
    its linear branch (above 20)."""
    r, out = _rng("delta_decay"), []
    for T, H in ((1, 8), (6, 5)):
        w: dict = {}
        A = _vector(w, "blk.0.ssm_a", -r.uniform(0.5, 8.0, H))
        bias = _vector(w, "blk.0.ssm_dt.bias", r.uniform(-2.0, 1.0, H))
        st = Stage("blk.0.ssm_g", "delta_decay", ("ssm_alpha",), A, bias, params={"n_head": H, "out": H}, layer=0)
        alpha = r.standard_normal((T, H))
        alpha[0, 0] = 25.0
        shows = frozenset({"no_softplus", "dt_bias_twice", "a_positive"})
        out.append(OpCase(f"T{T} H{H}", st, [alpha], T, weights=w, exposes=shows))
    return out


def cases_l2norm() -> list[OpCase]:
    """q at column 0 and k after it, in rows of the conv's channels; heads of odd sizes."""
    r, out = _rng("l2norm"), []
    for T, heads, d, offset, channels in ((1, 4, 32, 0, 384), (6, 3, 37, 111, 300)):
        P = {"group": d, "width": heads * d, "offset": offset, "eps": 1e-6, "channels": channels}
        st = Stage("blk.0.ssm_k", "l2norm", ("ssm_conv",), params=P, layer=0)
        x = r.standard_normal((T, channels)) * 3
        out.append(OpCase(f"T{T} {heads}x{d}+{offset}", st, [x], T, exposes=frozenset({"unnormed"})))
    return out


def _delta_inputs(r, T: int, H: int, Hk: int, d: int) -> list[np.ndarray]:
    def unit(a):
        return (a / np.linalg.norm(a.reshape(T, Hk, d), axis=-1, keepdims=True).reshape(T, Hk, 1).repeat(d, 2)
                .reshape(T, -1))  # fmt: skip

    q, k = unit(r.standard_normal((T, Hk * d))), unit(r.standard_normal((T, Hk * d)))
    conv = r.standard_normal((T, 2 * Hk * d + H * d))
    return [q, k, conv, -r.uniform(0.01, 1.5, (T, H)), r.uniform(0.05, 1.0, (T, H))]


def cases_delta_net() -> list[OpCase]:
    """Value heads over fewer key heads (tiled), odd head sizes, prompts within one of the GPU's chunks of 16,
    at its edge, across two and past the reference's chunk of 64 (a partial last chunk), a decode step; a
    memory never zero. The chunk_boundary fault shows once a prompt spans two chunks."""
    r, out = _rng("delta_net"), []
    for T, H, Hk, d in ((1, 8, 4, 32), (9, 6, 3, 7), (16, 2, 2, 16), (33, 4, 2, 13), (70, 2, 1, 16), (5, 4, 4, 37)):
        P = {
            "n_head": H,
            "n_k_head": Hk,
            "head_k": d,
            "head_v": d,
            "channels": 2 * Hk * d + H * d,
            "v_offset": 2 * Hk * d,
            "interleave": int(T == 9),
        }  # fmt: skip (Qwen3-Next's key heads in place)
        st = Stage("blk.0.ssm_delta", "delta_net", ("q", "k", "conv", "g", "beta"), params=P, layer=0, state="scan")
        cache = {"scan": r.standard_normal((H, d, d))}
        shows = {"beta_twice"} | ({"state_reset"} if T <= 16 else set()) | ({"chunk_boundary"} if T > 16 else set())
        out.append(OpCase(f"T{T} H{H}/{Hk} d{d}", st, _delta_inputs(r, T, H, Hk, d), T, cache=cache,
                          exposes=frozenset(shows)))  # fmt: skip
    return out


def cases_gated_add() -> list[OpCase]:
    r = _rng("gated_add")
    st = Stage("blk.0.ffn_out", "gated_add", ("moe", "shared", "logit"), params={"width": 131}, layer=0)
    xs = [r.standard_normal((5, 131)), r.standard_normal((5, 131)), r.standard_normal((5, 1)) * 3]
    return [OpCase("T5 w131", st, xs, 5)]


def cases_relu_sqr() -> list[OpCase]:
    r = _rng("relu_sqr")
    st = Stage("blk.1.ffn_act", "relu_sqr", ("ffn_up",), params={"width": 77}, layer=1)
    return [OpCase("3x77", st, [r.standard_normal((3, 77)) * 2], 3)]


def cases_kv_cache() -> list[OpCase]:
    """Each cache type's write of new rows after cached ones: a decode step at an odd position, a prefill
    of rows of 3 blocks (a thread's group of two blocks cut short), and rows whose blocks differ in scale
    by up to 100x (the scale is per block of 32), with a zero block among them."""
    from labkit.ops.kv_cache import STORED, row_words

    r, out = _rng("kv_cache"), []
    for t in STORED:
        for T, n_past, width in ((1, 5, 64), (7, 0, 96), (3, 2, 128)):
            st = Stage("blk.0.k_cache", "kv_cache", ("k_rope",), params={"type": t, "width": width}, layer=0,
                       kv_write="k")  # fmt: skip
            scale = np.repeat(10.0 ** r.uniform(-1, 1, (T, width // 32)), 32, axis=1)
            x = r.standard_normal((T, width)) * scale
            if T == 3:
                x[1, 32:64] = 0.0
            cache = {"k": np.zeros((n_past + T + 2, row_words(t, width)))}
            shows = frozenset({"scale_per_64"} if t == "q8_0" else set())
            out.append(OpCase(f"{t} T{T} n_past{n_past} w{width}", st, [x], T, n_past, cache=cache, exposes=shows))
    return out


def cases_hadamard() -> list[OpCase]:
    """Blocks of 64 (V's rotation) and of 128 and 256 (K's, the largest power of two dividing the head), a decode
    row and a prefill, at an offset."""
    r, out = _rng("hadamard"), []
    for T, n, width in ((1, 64, 192), (5, 128, 256), (3, 256, 512)):
        st = Stage("blk.0.k_rot", "hadamard", ("k_rope",), params={"n": n, "width": width}, layer=0)
        out.append(OpCase(f"T{T} n{n} w{width}", st, [r.standard_normal((T, width)) * 3], T))
    return out


def cases_argmax() -> list[OpCase]:
    """Rows of one value, of fewer values than threads, of a vocabulary past 49152 values at an odd width; a
    row whose largest value sits twice (the lowest id wins, as numpy's) and one of -inf but one value."""
    r, out = _rng("argmax"), []
    for T, n in ((1, 1), (3, 63), (2, 1000), (1, 49153)):
        x = r.standard_normal((T, n)) * 10
        if n >= 63:
            x[0, [5, n - 7]] = x[0].max() + 1.0  # a tie: the first wins
        if T > 1:
            x[1, :] = -np.inf
            x[1, n // 2] = -3.0
        st = Stage("next_token", "argmax", ("logits",), params={"width": n})
        out.append(OpCase(f"T{T} n{n}", st, [x], T))
    return out


CASES = {name: globals()[f"cases_{name}"] for name in NMSE}


# ----------------------------------------------------------------- the harness (float64 side)
@dataclass
class HarnessInputs:
    """labkit.ops.base.RefInputs over a case: the float64 side."""

    case: OpCase
    states: dict[str, np.ndarray] = field(default_factory=dict)  # what a state-advancing op left

    def state(self, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(self.case.cache[kind], np.float64).reshape(shape)

    def set_state(self, kind: str, value: np.ndarray) -> None:
        self.states[kind] = value

    @property
    def x(self):
        return [np.asarray(a, np.float64) for a in self.case.inputs]

    @property
    def ids(self):
        return self.case.ids

    @property
    def positions(self):
        return self.case.n_past + np.arange(self.case.T)

    @property
    def n_past(self):
        return self.case.n_past

    def weight(self, name: str, rows=None) -> np.ndarray:
        w = self.case.weight(name)
        return w if rows is None else w[rows[0] : rows[1]]

    def rows(self, name: str, ids) -> np.ndarray:
        return self.case.weight(name)[ids]

    def matmul(self, x: np.ndarray, name: str, rows=None) -> np.ndarray:
        return x @ self.weight(name, rows).T  # the case's weight, from gguf.quants: float64 throughout

    def cached(self, kind: str) -> np.ndarray:
        return self.case.cache[kind][: self.case.n_past + self.case.T]


def run_case(case: OpCase, kernel: Kernel, policies: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """(GPU output, float64 reference) of one case under one kernel and policy selection: the GPU side
    through labkit.gpu.op_harness, the op's plan on the StageContext a real pass gives it."""
    got, states = run_stage_states(case, kernel, policies)
    ref = HarnessInputs(case)
    want = OPS[case.stage.op].reference(case.stage, ref)
    if ref.states:  # a state-advancing op: its output, then the state it leaves
        got = np.concatenate([got.ravel(), *(states[k] for k in ref.states)])
        want = np.concatenate([want.ravel(), *(np.ravel(v) for v in ref.states.values())])
    return got, want


def error(got: np.ndarray, want: np.ndarray) -> tuple[float, str]:
    """(NMSE over finite values, what differs): a differing NaN/inf pattern is an infinite error."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    for what, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        if not np.array_equal(test(got), test(want)):
            return np.inf, f"{what} at {int((test(got) != test(want)).sum())} places differs"
    fin = np.isfinite(want)
    num, den = np.sum((got[fin] - want[fin]) ** 2), np.sum(want[fin] ** 2)
    mx = float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))
    return float(num / den) if den else float(num), f"max|diff| {mx:.3e}"


# ----------------------------------------------------------------- the parametrization
KERNELS_OF = {"head_matmul": "moe_matmul"}  # an op that runs another op's kernels: a head is an expert


def _variants(op: str) -> list[tuple[str, str, str]]:
    """(family, variant, kind) of every kernel and policy the op declares (or runs: KERNELS_OF)."""
    out = [(k.family, k.name, "kernel") for k in OPS[KERNELS_OF.get(op, op)].kernels]
    return out + [(p.family, p.name, "policy") for p in OPS[op].policies]


def _applies(case: OpCase, family: str, kind: str) -> bool:
    """A matmul kernel family runs only its weight format; the lm_head policy only the unembedding."""
    if kind == "kernel":
        return family == OPS[case.stage.op].family_of(case.stage, lambda w: case.weights[w][1])
    return family in OPS[case.stage.op].policy_families(case.stage)


def _faulty(family: str, name: str, kind: str) -> bool:
    v = get_kernel(family, name) if kind == "kernel" else get_policy(family, name)
    return v.faulty and (family, name) not in HARMLESS | BATCH_ONLY


def _params():
    """Every (case, variant) whose outcome is known: a correct variant on every case of its op, a
    faulty one on the cases that expose it (elsewhere it may or may not show, so it is not run)."""
    for op in NMSE:
        for case in CASES[op]():
            for family, name, kind in _variants(op):
                if _applies(case, family, kind) and (not _faulty(family, name, kind) or name in case.exposes):
                    yield pytest.param(op, case, family, name, kind, id=f"{op}-{family}/{name}-{case.label}")


@pytest.mark.parametrize("op,case,family,name,kind", list(_params()))
def test_op_variant_on_generated_case(op, case, family, name, kind):
    if kind == "kernel":
        kernel, policies = get_kernel(family, name), {}
    else:
        fam = OPS[op].family_of(case.stage, lambda w: case.weights[w][1])
        kernel, policies = get_kernel(fam, POLICY_KERNEL.get(family, "default"), "cpu"), {family: name}
    got, want = run_case(case, kernel, policies)
    err, detail = error(got, want)
    where = f"{op} {family}/{name} on {case.label}: nmse {err:.3e} vs threshold {NMSE[op]:.0e}, {detail} (seed {SEED})"
    if _faulty(family, name, kind):  # only generated on the cases that expose it
        assert err > 100 * NMSE[op], "the fault does not show: " + where
    else:
        assert err <= NMSE[op], where


def test_every_op_and_variant_has_cases():
    """Coverage: every op of the registry has cases and a threshold; every faulty variant (but the
    documented harmless ones) is exposed by at least one of its op's cases."""
    assert set(NMSE) == set(OPS), f"ops without generated cases: {set(OPS) - set(NMSE)}"
    for op in OPS:
        exposed = set().union(*(c.exposes for c in CASES[op]()))
        for family, name, kind in _variants(op):
            if _faulty(family, name, kind):
                assert name in exposed, f"{op}: faulty {family}/{name} is exposed by no case"


def test_every_weight_format_has_cases_on_every_driver():
    """Coverage of formats: each kernel of every GGUF type's matmul family (each layout its record
    lists, and its faulty readers) runs on a generated decode case (T = 1: matvec) and a prefill
    case (tiled), as test-backend-ops loops over all types."""
    cases = CASES["matmul"]()
    for fmt in FORMATS_LIST:
        mine = [
            c for c in cases if OPS["matmul"].family_of(c.stage, lambda w, c=c: c.weights[w][1]) == f"matmul_{fmt.name}"
        ]
        assert {c.T == 1 for c in mine} == {True, False}, f"{fmt.type_name}: needs a decode and a prefill case"
        kernels = {k.name for k in OPS["matmul"].kernels if k.family == f"matmul_{fmt.name}"}
        assert set(fmt.layouts) <= kernels, f"{fmt.type_name}: a layout without its kernel"
        for name in kernels:
            params = [p for p in _params() if p.values[2] == f"matmul_{fmt.name}" and p.values[3] == name]
            assert {p.values[1].T == 1 for p in params} == {True, False}, f"{fmt.type_name}/{name}: {len(params)} cases"


def test_a_user_case_runs_through_the_op_harness():
    """labkit.gpu.op_harness as a kernel author uses it: a StageCase built by hand (an F32 norm
    weight, 3 tokens of odd width), the default rmsnorm kernel, against numpy's formula."""
    from labkit.gpu.op_harness import StageCase

    r = _rng("user case")
    n, T = 77, 3
    x, w = r.standard_normal((T, n)), r.standard_normal(n).astype(np.float32)
    st = Stage("n", "rmsnorm", ("x",), "w", params={"eps": 1e-6, "group": n, "width": n})
    case = StageCase(st, [x], T, weights={"w": (w.view(np.uint8), Q.F32, (1, n))})
    got = run_stage(case, get_kernel("rmsnorm"))
    want = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6) * w
    diff = np.abs(got - want).max()
    assert got.shape == (T, n) and diff < 1e-5, f"max |diff| {diff:.3e}"
