"""ssm_scan: Mamba-2's selective scan (SSD), continuing the layer's scan state.

Per head h (its B and C those of group h / (n_head / n_group)), with dt' = softplus(dt) and a
decay a = exp(dt' · A) (A < 0: the file stores -exp(A_log)), each token updates the state
[head_dim, d_state] and reads it with C:

    S ← a · S + (dt' · x) ⊗ B        y = S · C

as ggml_ssm_scan does, token by token (the recurrent form: how an engine decodes). The chunked
form (how engines run a prompt: state-space duality) computes the same y inside each chunk as a
masked, decayed attention of C over B, plus the state the chunk starts from, and carries the state
between chunks; the float64 reference runs a prompt that way and a decode step recurrently, and
the two agree to 1e-12 (tests/ops/test_ssm_scan.py). The GPU does the same: a prompt in chunks of 16
(ssm_scan_chunked.wgsl, a workgroup a head), a decode step token by token. The state left for the next pass is laid out
as llama.cpp's cache_s holds it: [n_head, head_dim, d_state], d_state fastest."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose, wgsl_const

PARAMS = Params(T="u32", n_head="u32", head_dim="u32", d_state="u32", n_group="u32", channels="u32")
CHUNK = 64  # the reference's chunk for a prompt (SSD engines use 256; tests cross smaller ones)


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_compute_softplus_f32: x above 20 as it is, else log(1 + e^x)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def split_xbc(xbc: np.ndarray, P: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The conv's output as x [T, n_head, head_dim], B and C [T, n_head, d_state] (each head its group's)."""
    T, H, N, G = xbc.shape[0], P["n_head"], P["d_state"], P["n_group"]
    x = xbc[:, : P["d_inner"]].reshape(T, H, -1)
    B = xbc[:, P["d_inner"] : P["d_inner"] + G * N].reshape(T, G, N)
    C = xbc[:, P["d_inner"] + G * N :].reshape(T, G, N)
    per = np.arange(H) // (H // G)
    return x, B[:, per], C[:, per]


def scan_recurrent(x, dt, A, B, C, state):
    """Token by token: (y [T, H, P], the new state [H, P, N]); dt already through softplus."""
    S = state.copy()
    y = np.empty_like(x)
    for t in range(x.shape[0]):
        a = np.exp(dt[t] * A)  # [H]
        S = a[:, None, None] * S + (dt[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", S, C[t])
    return y, S


def scan_chunked(x, dt, A, B, C, state, chunk: int = CHUNK):
    """Chunk by chunk (state-space duality): inside a chunk y_t = Σ_{s≤t} e^{L_t - L_s} (C_t·B_s) dt_s x_s
    + e^{L_t} C_t·S₀, with L the cumulative log-decay; the chunk's last state carried to the next."""
    S = state.copy()
    ys = []
    for t0 in range(0, x.shape[0], chunk):
        xs, ds, Bs, Cs = x[t0 : t0 + chunk], dt[t0 : t0 + chunk], B[t0 : t0 + chunk], C[t0 : t0 + chunk]
        L = np.cumsum(ds * A, axis=0)  # [Q, H]
        seg = L[:, None, :] - L[None, :, :]  # [t, s, H]
        causal = np.tril(np.ones((len(xs), len(xs)), dtype=bool))[:, :, None]
        decay = np.where(causal, np.exp(np.where(causal, seg, 0.0)), 0.0)
        scores = np.einsum("thn,shn->tsh", Cs, Bs) * decay  # [t, s, H]
        y = np.einsum("tsh,sh,shp->thp", scores, ds, xs)
        y += np.exp(L)[:, :, None] * np.einsum("thn,hpn->thp", Cs, S)
        tail = np.exp(L[-1][None, :] - L)  # [s, H]: decay from s to the chunk's end
        S = np.exp(L[-1])[:, None, None] * S + np.einsum("sh,sh,shp,shn->hpn", tail, ds, xs, Bs)
        ys.append(y)
    return np.concatenate(ys), S


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    x, B, C = split_xbc(ref.x[0], P)
    dt = softplus(ref.x[1])
    A = ref.weight(stage.weight).ravel()
    state = ref.state("scan", (P["n_head"], P["d_inner"] // P["n_head"], P["d_state"]))
    form = scan_recurrent if x.shape[0] == 1 else scan_chunked
    y, new = form(x, dt, A, B, C, state)
    ref.set_state("scan", new)
    return y.reshape(x.shape[0], -1)


def workgroups(rows: int) -> int:
    return ceil_div(rows, 64)


def plan(stage, gpu):
    P = stage.params
    xbc, dt = gpu.input(0), gpu.input(1)
    out = gpu.output((gpu.T, P["d_inner"]))
    values = {"T": gpu.T, "n_head": P["n_head"], "head_dim": P["d_inner"] // P["n_head"], "d_state": P["d_state"],
              "n_group": P["n_group"], "channels": P["channels"]}  # fmt: skip
    operands = [xbc.buffer, dt.buffer, gpu.vector(stage.weight), gpu.state("scan"), out.buffer]
    chunked = wgsl_const(gpu.kernel.source(gpu.shape), "CHUNK", 0)  # a workgroup a head, else a thread a row
    gpu.dispatch(operands, values, P["n_head"] if chunked else workgroups(P["d_inner"]))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    H, N = P["n_head"], P["d_state"]
    ins = [f"xBC [T, {P['channels']}]", f"dt [T, {H}]", f"{stage.weight} [{H}]"]
    return [*ins, f"scan state [{H}, {P['d_inner'] // H}, {N}]"], f"[T, {P['d_inner']}]"


def _with(*parts: str, carry: str = "ssm_scan_carry", chunked: bool = True):
    """The chunked form for a prompt (ssm_scan_chunked.wgsl), the recurrent one for a decode step, as engines
    run them (`chunked=False`: the recurrent form for both), composed before its parts."""

    def source(shape):
        return compose("ssm_scan_chunked" if chunked and shape.T > 1 else "ssm_scan", *parts, carry)

    return source


CORRECT = ("ssm_scan_step", "ssm_scan_decay", "ssm_scan_start")
OP = Op(
    output=lambda st, s: (s.T, st.params["d_inner"]),
    name="ssm_scan",
    what="the selective scan: each token decays the state by exp(softplus(dt)·A), writes dt·x ⊗ B into it, "
    "and reads it with C",
    formula="S ← exp(dt'·A)·S + (dt'·x) ⊗ B;  y = S·C;  dt' = softplus(dt)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(
        Kernel(
            "ssm_scan",
            "default",
            "the correct kernel: a prompt in chunks of 16, a workgroup a head (state-space duality); a decode step "
            "token by token, a thread a head row",
            _with(*CORRECT),
        ),
        Kernel(
            "ssm_scan",
            "recurrent",
            "the correct kernel, token by token for a prompt too (a thread a head row): the chunked form's twin",
            _with(*CORRECT, chunked=False),
        ),
        Kernel(
            "ssm_scan",
            "state_reset",
            "FAULTY: the scan state reset to zero at every pass (a prefix or chunk that restores the KV "
            "cache but not the state: SGLang #16053); one pass alone is right",
            _with("ssm_scan_step", "ssm_scan_decay", "ssm_scan_start_zero"),
            faulty=True,
        ),
        Kernel(
            "ssm_scan",
            "no_softplus",
            "FAULTY: dt used without its softplus (a kernel that assumes the caller applied it: where the "
            "softplus and dt_bias go, caller or kernel, is what flash-linear-attention #63 got wrong in Mamba-2)",
            _with("ssm_scan_step_raw", "ssm_scan_decay", "ssm_scan_start"),
            faulty=True,
        ),
        Kernel(
            "ssm_scan",
            "a_positive",
            "FAULTY: A used without its minus sign (A_log's exp taken as A), so the state grows each token "
            "(the sign readers of A = -exp(A_log) ask about: state-spaces/mamba #326)",
            _with("ssm_scan_step", "ssm_scan_decay_unsigned", "ssm_scan_start"),
            faulty=True,
        ),
        Kernel(
            "ssm_scan",
            "chunk_boundary",
            "FAULTY: past a prompt's first chunk, each chunk starts from a zero state instead of the one the chunk "
            "before left (a chunked scan that drops the carried state); decode steps and short prompts are right",
            _with(*CORRECT, carry="ssm_scan_carry_dropped"),
            faulty=True,
        ),
    ),
)
