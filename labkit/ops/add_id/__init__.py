"""add_id: each selected expert's bias, added to its slot's product (ggml's add_id).

Not a stage of its own: moe_matmul dispatches it after the product when the expert tensor has a
bias (gpt-oss's `ffn_gate_exps.bias`, [n_expert, out]), as matmul dispatches `add` for a dense
bias. Slot s of token t adds row ids[t, s] of the bias."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(total="u32", n="u32", ids_offset="u32", y_offset="u32")


def add_expert_bias(y: np.ndarray, bias: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """y [T, k, n] plus bias [n_expert, n] at each slot's expert."""
    return y + np.asarray(bias).reshape(-1, y.shape[-1])[np.asarray(ids, np.int64)]


def reference(stage, ref) -> np.ndarray:
    return add_expert_bias(ref.x[0], ref.x[1], ref.x[2])


def plan(stage, gpu):
    y, b, ids = gpu.input(0), gpu.input(1), gpu.input(2)
    out = gpu.output(y.shape)
    values = {"total": y.size, "n": y.shape[-1], "ids_offset": ids.offset, "y_offset": out.offset}
    gpu.dispatch([y.buffer, b.buffer, out.buffer, ids.buffer], values, ceil_div(y.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, k, {stage.params['width']}]"
    return [d, f"[n_expert, {stage.params['width']}]", "ffn_topk [T, k] int32"], d


OP = Op(
    output=lambda st, s: (s.T, st.params["k"], st.params["width"]),
    name="add_id",
    what="adds each selected expert's bias to its slot's product",
    formula="y[t, s] = a[t, s] + b[ids[t, s]]",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("add_id", "default", "the correct kernel", from_file("add_id")),),
)
