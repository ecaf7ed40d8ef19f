"""scale: every value times a constant: Granite's logits divided by its logit_scale (muP).

The embedding's kernel (ops/lib/scale.wgsl) does the same to the looked-up rows."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", scale="f32")


def reference(stage, ref) -> np.ndarray:
    return ref.x[0] * stage.params["scale"]


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    gpu.dispatch([x.buffer, out.buffer], {"n": x.size, "scale": stage.params["scale"]}, ceil_div(x.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    w = f"[T, {stage.params['width']}]"
    return [w], w


OP = Op(
    name="scale",
    what="multiplies every value by a constant (Granite divides its logits by logit_scale)",
    formula="y = s · x",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("scale", "default", "the correct kernel", from_file("scale")),),
)
