"""relu_sqr: max(x, 0)², the activation of Nemotron-H's FFN (up, then down; no gate).

ggml's build_ffn with LLM_FFN_RELU_SQR: a ReLU, then the square (ggml_sqr)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32")


def reference(stage, ref) -> np.ndarray:
    return np.maximum(ref.x[0], 0.0) ** 2


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
    name="relu_sqr",
    what="the FFN's activation without a gate: negative values to 0, the others squared",
    formula="y = max(x, 0)²",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("relu_sqr", "default", "the correct kernel", from_file("relu_sqr")),),
)
