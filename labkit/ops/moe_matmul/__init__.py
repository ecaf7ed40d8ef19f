"""moe_matmul: the selected experts' linear layers, ggml's mul_mat_id.

A mixture of experts stores each projection of all its experts as one 3-D tensor
(`ffn_gate_exps`: [n_expert, d_ff_expert, d_model]). For each token and each of its k slots, this
op multiplies the token's input by the rows of the expert the router picked for that slot
(`ffn_topk`), so only the selected experts' rows are read, on both engines. The input is shared by
the slots (gate and up read `ffn_norm`) or the slot's own (down reads each slot's activation);
the output is [T, k, out]. On the GPU the tensor's GGUF bytes are uploaded unchanged, in windows
of whole experts; each window's dispatch computes the slots whose expert it holds. A decode step
reads each slot's expert rows (`moe_matmul.wgsl`); a prefill first gathers the slots per expert, so
that an expert's rows are decoded once per tile of 8 slots that picked it (`moe_matmul_gathered.wgsl`).
"""

from __future__ import annotations

import numpy as np

from labkit.errors import GpuLimitError
from labkit.ops.add_id import add_expert_bias
from labkit.ops.base import Kernel, Op, Params, ceil_div, wgsl_const
from labkit.ops.matmul import FORMATS, format_name, source
from labkit.quant.formats import FORMATS_LIST

PARAMS = Params(K="u32", rows="u32", T="u32", k="u32", e0="u32", n_e="u32", x_offset="u32", x_tok="u32",
                x_slot="u32", ids_offset="u32", y_offset="u32", n_expert="u32", mode="u32")  # fmt: skip
ROWS_PER_WG = 256  # moe_matmul.wgsl: 64 threads x 4 rows


def family(stage, tensor_type) -> str:
    """`moe_matmul_<fmt>` of the stage's expert tensor: a format's reader is compiled in."""
    return "moe_matmul_" + format_name(tensor_type(stage.weight))


def slot_inputs(x: np.ndarray, T: int, k: int, per_slot: bool) -> np.ndarray:
    """[T, k, K]: each slot's input, the token's own row repeated, or the slot's row."""
    return x.reshape(T, k, -1) if per_slot else np.broadcast_to(x[:, None, :], (T, k, x.shape[-1]))


def reference(stage, ref) -> np.ndarray:
    """Per expert that any token picked: its rows times the inputs of the slots that picked it."""
    ids = np.asarray(ref.x[1])
    T, k = ids.shape
    N = stage.params["out"]
    xs = slot_inputs(ref.x[0], T, k, stage.params["per_slot"])
    out = np.zeros((T, k, N))
    for e in np.unique(ids):
        t, s = np.nonzero(ids == e)
        out[t, s] = ref.matmul(np.ascontiguousarray(xs[t, s]), stage.weight, (int(e) * N, (int(e) + 1) * N))
    return add_expert_bias(out, ref.weight(stage.bias), ids) if stage.bias else out


def check_gather_turns(stage_name: str, T: int, k: int, cap: int | None) -> None:
    """GpuLimitError where the gather (one thread per expert walks all T x k slots) would pass the
    device's cap on an invocation's loop turns: llvmpipe stops the loop there, silently, and the
    experts' slot lists come out short (labkit.ops.attn_ctx.loop_turns)."""
    if cap is not None and T * k + 1 > cap:
        raise GpuLimitError(
            f"{stage_name}: gathering {T} tokens x {k} experts = {T * k} slots in one thread would pass "
            f"llvmpipe's {cap} loop turns, where the loop stops and the expert lists come out short. "
            f"Use at most {(cap - 1) // k} tokens a pass on this device."
        )


def plan(stage, gpu):
    ids = gpu.input(1)
    T, k = ids.shape
    out = gpu.output((T, k, stage.params["out"]))
    dispatch(stage, gpu, gpu.input(0), ids, out, stage.params["per_slot"])
    return out


def dispatch(stage, gpu, x, ids, out, per_slot: bool) -> None:
    """The dispatches of y[t, s] = W[ids[t, s]] · x[t, (s)] into `out` ([T, k, N]): the experts' windows
    (a prefill's slots first gathered per expert), then each slot's expert bias where there is one."""
    P = stage.params
    T, k = ids.shape
    N, K = P["out"], P["in"]
    y = gpu.temp((T, k, N), "product") if stage.bias else out  # the product, before the experts' biases
    w = gpu.experts(stage.weight, N)
    n_expert = w.n_rows // N
    values = {"K": K, "rows": N, "T": T, "k": k, "x_offset": x.offset, "x_tok": K * k if per_slot else K,
              "x_slot": K if per_slot else 0, "ids_offset": ids.offset, "y_offset": y.offset,
              "n_expert": n_expert, "mode": 1}  # fmt: skip
    tile = wgsl_const(gpu.kernel.source(gpu.shape), "GATHER_TILE", 0)
    if tile:  # the slots listed per expert first: LIST[e * (T + 1)] holds expert e's count, then its slots
        check_gather_turns(stage.name, T, k, gpu.loop_turn_cap)
        slots = gpu.temp((n_expert * (T + 1),), "slots by expert")
        bind = lambda win: [win.buffer, x.buffer, y.buffer, ids.buffer, slots.buffer]  # noqa: E731
        gpu.dispatch(bind(w.windows[0]), {**values, "e0": 0, "n_e": 0, "mode": 0}, ceil_div(n_expert, 64))
    for win in w.windows:
        e0, n_e = win.first_row // N, win.n_rows // N
        if tile:
            groups = n_e * ceil_div(T, tile) * ceil_div(N, ROWS_PER_WG)
            gpu.dispatch(bind(win), {**values, "e0": e0, "n_e": n_e}, groups)
        else:
            operands = [win.buffer, x.buffer, y.buffer, ids.buffer]
            gpu.dispatch(operands, {**values, "e0": e0, "n_e": n_e}, ceil_div(N, ROWS_PER_WG) * T * k)
    if stage.bias:  # gpt-oss: each slot's expert's bias (ggml's add_id)
        values = {"total": y.size, "n": N, "ids_offset": ids.offset, "y_offset": out.offset}
        operands = [y.buffer, gpu.vector(stage.bias), out.buffer, ids.buffer]
        gpu.dispatch_op("add_id", operands, values, ceil_div(y.size, 64))


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    x = f"[T, k, {P['in']}]" if P["per_slot"] else f"[T, {P['in']}]"
    bias = [f"{stage.bias} [n_expert, {P['out']}]"] if stage.bias else []
    w = f"{stage.weight} [n_expert, {P['out']}, {P['in']}]"
    return [x, "ffn_topk [T, k] int32", w, *bias], f"[T, k, {P['out']}]"


def _kernels() -> tuple[Kernel, ...]:
    """Per format: the default (a decode step per slot, a prefill gathered per expert) and `per_slot`
    (every pass per slot: the rows of an expert decoded again for each token that picked it)."""

    def by_shape(fmt: str):
        return lambda shape: source(fmt, "moe_matmul" if shape.T == 1 else "moe_matmul_gathered")

    return tuple(
        kernel
        for f in FORMATS_LIST
        for kernel in (
            Kernel(f"moe_matmul_{f.name}", "default",
                   "4 rows per thread of the selected expert, on the GGUF bytes; a prefill's slots gathered per expert",
                   by_shape(f.name)),
            Kernel(f"moe_matmul_{f.name}", "per_slot", "4 rows per thread of each slot's expert, every pass shape",
                   lambda shape, fmt=f.name: source(fmt, "moe_matmul")),
        )
    )  # fmt: skip


OP = Op(
    output=lambda st, s: (s.T, st.params["k"], st.params["out"]),
    name="moe_matmul",
    what="the linear layer of the expert each slot selected, for each token's k slots",
    formula="y[t, s, n] = Σ_c x[t, (s,) c] · W[ids[t, s], n, c]  (+ b[ids[t, s], n] where the experts have biases)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=_kernels(),
    family=family,
    weight="experts",
)
assert set(FORMATS.values()) == {f.name for f in FORMATS_LIST}
