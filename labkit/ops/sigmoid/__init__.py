"""sigmoid: 1 / (1 + e^-x) of every value: the gated delta net's write strength beta from its logits."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference(stage, ref) -> np.ndarray:
    return sigmoid(ref.x[0])


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    gpu.dispatch([x.buffer, out.buffer], {"n": x.size}, ceil_div(x.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    w = f"[T, {stage.params['width']}]"
    return [w], w


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="sigmoid",
    what="squashes each value into (0, 1): the delta rule's write strength per head and token",
    formula="y = 1 / (1 + e^-x)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("sigmoid", "default", "the correct kernel", from_file("sigmoid")),),
)
