"""delta_net: the gated delta rule (Qwen3.5, Qwen3-Next), continuing the layer's recurrent state.

Each value head h keeps a fast-weight memory M [d_v, d_k] (its key head is h mod n_k_heads, as
ggml's gated_delta_net tiles them; Qwen3-Next's graph repeats each key head in place, h // (n_v / n_k):
`interleave`). A token decays it by e^g, reads what it holds for its key k,
writes the difference to its value v with strength beta, and is answered by its query q:

    M ← e^g · M;   M ← M + β (v − M k) kᵀ;   o = M q / sqrt(d_k)

That is the recurrent form (ggml_gated_delta_net, token by token: how an engine decodes). The
chunked form (how engines run a prompt: FLA's chunk_gated_delta_rule, llama.cpp's
build_delta_net_chunking) solves a chunk's writes at once through the UT transform
T = (I + strictly_lower(β K Kᵀ ⊙ decay))⁻¹ and carries M between chunks. The float64 reference
runs a prompt chunked and a decode step recurrently; they agree to 1e-12 (tests/ops/test_delta_net.py).
The GPU does the same: a prompt in chunks of 16 (delta_net_chunked.wgsl), a decode step token by token.
The state is laid out as llama.cpp's cache_s holds it: [n_head, d_v, d_k], d_k fastest."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose, wgsl_const

PARAMS = Params(
    T="u32", n_head="u32", n_k_head="u32", head_k="u32", head_v="u32", channels="u32", v_offset="u32", interleave="u32"
)
CHUNK = 64  # the reference's chunk for a prompt (llama.cpp's build_delta_net_chunking uses 64 too)


def delta_recurrent(q, k, v, g, beta, M):
    """Token by token: (o [T, H, d_v], the new state [H, d_v, d_k]); q, k, v per value head, q unscaled."""
    M = M.copy()
    o = np.empty_like(v)
    scale = 1.0 / np.sqrt(q.shape[-1])
    for t in range(q.shape[0]):
        M *= np.exp(g[t])[:, None, None]
        d = (v[t] - np.einsum("hjk,hk->hj", M, k[t])) * beta[t][:, None]
        M += d[:, :, None] * k[t][:, None, :]
        o[t] = np.einsum("hjk,hk->hj", M, q[t]) * scale
    return o, M


def delta_chunked(q, k, v, g, beta, M, chunk: int = CHUNK):
    """Chunk by chunk: within one, the writes' corrections solved at once (the UT transform), the
    state read at the chunk's start decayed to each token, the chunk's last state carried on."""
    S = np.transpose(M, (0, 2, 1)).copy()  # [H, d_k, d_v]
    scale = 1.0 / np.sqrt(q.shape[-1])
    out = []
    for t0 in range(0, q.shape[0], chunk):
        Q, K, V = (a[t0 : t0 + chunk].transpose(1, 0, 2) for a in (q, k, v))  # [H, C, d]
        G, B = g[t0 : t0 + chunk].T, beta[t0 : t0 + chunk].T  # [H, C]
        out.append(_chunk(Q * scale, K, V, np.cumsum(G, axis=1), B, S))
    return np.concatenate(out, axis=1).transpose(1, 0, 2), np.transpose(S, (0, 2, 1)).copy()


def _chunk(Q, K, V, gc, B, S):
    """One chunk for all heads; advances S [H, d_k, d_v] in place and returns o [H, C, d_v]."""
    C = Q.shape[1]
    seg = gc[:, :, None] - gc[:, None, :]  # [H, i, j]: log-decay from j to i
    lower = np.tril(np.ones((C, C), dtype=bool))
    decay = np.exp(np.where(lower, seg, -np.inf))  # j ≤ i
    strict = decay * ~np.eye(C, dtype=bool)
    A = B[:, :, None] * np.einsum("hid,hjd->hij", K, K) * strict
    Tm = np.linalg.solve(np.eye(C) + A, np.broadcast_to(np.eye(C), A.shape))  # (I + A)⁻¹, lower triangular
    W = Tm @ (B[:, :, None] * K * np.exp(gc)[:, :, None])
    U = Tm @ (B[:, :, None] * V)
    V_new = U - W @ S
    o = (Q * np.exp(gc)[:, :, None]) @ S + (np.einsum("hid,hjd->hij", Q, K) * decay) @ V_new
    last = gc[:, -1]
    S *= np.exp(last)[:, None, None]
    S += np.einsum("hjd,hje->hde", K * np.exp(last[:, None] - gc)[:, :, None], V_new)
    return o


def split_heads(stage, ref) -> tuple[np.ndarray, ...]:
    """q, k per value head (its key head tiled), v out of the conv's output: each [T, H, d]."""
    P = stage.params
    q, k, conv, g, beta = ref.x
    T, H, Hk, dk, dv = q.shape[0], P["n_head"], P["n_k_head"], P["head_k"], P["head_v"]
    per = np.arange(H) // (H // Hk) if P.get("interleave") else np.arange(H) % Hk
    v = conv[:, P["v_offset"] : P["v_offset"] + H * dv].reshape(T, H, dv)
    return q.reshape(T, Hk, dk)[:, per], k.reshape(T, Hk, dk)[:, per], v, g, beta


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    q, k, v, g, beta = split_heads(stage, ref)
    M = ref.state("scan", (P["n_head"], P["head_v"], P["head_k"]))
    form = delta_recurrent if q.shape[0] == 1 else delta_chunked
    o, new = form(q, k, v, g, beta, M)
    ref.set_state("scan", new)
    return o.reshape(q.shape[0], -1)


def plan(stage, gpu):
    P = stage.params
    ins = [gpu.input(i).buffer for i in range(5)]
    out = gpu.output((gpu.T, P["n_head"] * P["head_v"]))
    values = {"T": gpu.T, **{k: P[k] for k in ("n_head", "n_k_head", "head_k", "head_v", "channels", "v_offset")},
              "interleave": P.get("interleave", 0)}  # fmt: skip
    chunked = wgsl_const(gpu.kernel.source(gpu.shape), "CHUNK", 0)  # a workgroup a head, else a thread a row
    wgs = P["n_head"] if chunked else ceil_div(P["n_head"] * P["head_v"], 64)
    gpu.dispatch([*ins, gpu.state("scan"), out.buffer], values, wgs)
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    H, Hk, dk, dv = P["n_head"], P["n_k_head"], P["head_k"], P["head_v"]
    ins = [f"q [T, {Hk * dk}]", f"k [T, {Hk * dk}]", f"v: columns of [T, {P['channels']}]", f"g [T, {H}]",
           f"beta [T, {H}]", f"state [{H}, {dv}, {dk}]"]  # fmt: skip
    return ins, f"[T, {H * dv}]"


def _with(strength: str, start: str, carry: str = "delta_net_carry", chunked: bool = True):
    """The chunked form for a prompt (delta_net_chunked.wgsl), the recurrent one for a decode step, as engines
    run them (`chunked=False`: the recurrent form for both), composed before its parts."""

    def source(shape):
        driver = "delta_net_chunked" if chunked and shape.T > 1 else "delta_net"
        return compose(driver, strength, start, carry)

    return source


OP = Op(
    output=lambda st, s: (s.T, st.params["n_head"] * st.params["head_v"]),
    name="delta_net",
    what="the gated delta rule: a per-head memory that each token decays, corrects toward its value under its "
    "key, and reads with its query",
    formula="M ← e^g·M;  M ← M + β(v − M k)kᵀ;  o = M q / √d_k",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel(
            "delta_net",
            "default",
            "the correct kernel: a prompt in chunks of 16, a workgroup a head (the UT transform in workgroup "
            "memory); a decode step token by token, a thread a value row",
            _with("delta_net_strength", "delta_net_start"),
        ),
        Kernel(
            "delta_net",
            "recurrent",
            "the correct kernel, token by token for a prompt too (a thread a value row): the chunked form's twin",
            _with("delta_net_strength", "delta_net_start", chunked=False),
        ),
        Kernel(
            "delta_net",
            "state_reset",
            "FAULTY: the recurrent state reset to zero at every pass (a chunked prompt, or a prefix cache that "
            "restores the KV cache but not the state: SGLang #16053, vLLM #53912); one pass alone is right",
            _with("delta_net_strength", "delta_net_start_zero"),
            faulty=True,
        ),
        Kernel(
            "delta_net",
            "beta_twice",
            "FAULTY: the write strength beta applied twice (a fused kernel fed v·beta where it multiplies by beta "
            "itself)",
            _with("delta_net_strength_squared", "delta_net_start"),
            faulty=True,
        ),
        Kernel(
            "delta_net",
            "chunk_boundary",
            "FAULTY: past a prompt's first chunk, each chunk starts from a zero state instead of the one the chunk "
            "before left (a chunked kernel that drops the carried state); decode steps and short prompts are right",
            _with("delta_net_strength", "delta_net_start", "delta_net_carry_dropped"),
            faulty=True,
        ),
    ),
)
