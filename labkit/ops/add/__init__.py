"""add: the residual connection, a stage's input plus what the block computed from it (times the
stage's `scale`, Granite's muP residual multiplier; 1 elsewhere).

The same kernel adds a matmul's bias (B repeats with period N); the executor uses it for that."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", period="u32", y_offset="u32", scale="f32")


def reference(stage, ref) -> np.ndarray:
    return ref.x[0] + stage.params.get("scale", 1.0) * ref.x[1]


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    a, b = gpu.input(0), gpu.input(1)
    out = gpu.output(a.shape)
    values = {"n": a.size, "period": b.size, "y_offset": out.offset, "scale": stage.params.get("scale", 1.0)}
    gpu.dispatch([a.buffer, b.buffer, out.buffer], values, workgroups(a.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['width']}]"
    return [d, d], d


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="add",
    what="adds the block's output to the residual stream",
    formula="y = a + b",
    formula_of=lambda st: "y = a + s · b" if st.params.get("scale", 1.0) != 1.0 else "y = a + b",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("add", "default", "the correct kernel", from_file("add")),),
)
