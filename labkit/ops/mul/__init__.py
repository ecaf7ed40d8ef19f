"""mul: a matmul's output times its per-tensor scale (BitNet's `attn_q.scale`, ...).

Not a stage of its own: the matmul op dispatches it after its product when the weight has a
scale, as it dispatches `add` for a bias (llama.cpp's build_lora_mm: `mul_mat(w, x) * w_s`).
B repeats with period 1 for a scalar, or the row width for a per-row vector."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", period="u32", y_offset="u32")


def reference(stage, ref) -> np.ndarray:
    return ref.x[0] * ref.x[1]


def plan(stage, gpu):
    a, b = gpu.input(0), gpu.input(1)
    out = gpu.output(a.shape)
    values = {"n": a.size, "period": b.size, "y_offset": out.offset}
    gpu.dispatch([a.buffer, b.buffer, out.buffer], values, ceil_div(a.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['width']}]"
    return [d, "[1] or [width]"], d


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="mul",
    what="scales a product by its weight's per-tensor scale",
    formula="y = a · b  (b broadcast)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("mul", "default", "the correct kernel", from_file("mul")),),
)
