"""moe_sum: a mixture of experts' output, each token's k expert outputs weighted by the router and
summed (llama.cpp's ffn_moe_weighted, then the adds of its views: ffn_moe_out)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(T="u32", k="u32", n="u32", x_offset="u32", w_offset="u32", y_offset="u32")


def reference(stage, ref) -> np.ndarray:
    down, w = ref.x[0], ref.x[1]  # [T, k, n], [T, k]
    out = down[:, 0] * w[:, 0, None]
    for s in range(1, down.shape[1]):  # slot by slot, in llama.cpp's order
        out = out + down[:, s] * w[:, s, None]
    return out


def plan(stage, gpu):
    x, w = gpu.input(0), gpu.input(1)
    T, k, n = x.shape
    out = gpu.output((T, n))
    values = {"T": T, "k": k, "n": n, "x_offset": x.offset, "w_offset": w.offset, "y_offset": out.offset}
    gpu.dispatch([x.buffer, w.buffer, out.buffer], values, ceil_div(T * n, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    n = stage.params["width"]
    return [f"[T, k, {n}]", "[T, k]"], f"[T, {n}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="moe_sum",
    what="sums each token's expert outputs, weighted by the router",
    formula="y[t, n] = Σ_s w[t, s] · x[t, s, n]",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("moe_sum", "default", "the correct kernel", from_file("moe_sum")),),
)
