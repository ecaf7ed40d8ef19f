"""softcap: Gemma 2's final logit soft-capping, cap · tanh(x / cap).

It keeps logits inside (-cap, cap) smoothly. (Gemma 2 caps its attention scores too; that
happens inside the attention kernels, before the mask, through their `softcap` field.)"""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", cap="f32")


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap)


def reference(stage, ref) -> np.ndarray:
    return softcap(ref.x[0], stage.params["cap"])


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    gpu.dispatch([x.buffer, out.buffer], {"n": x.size, "cap": stage.params["cap"]}, workgroups(x.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['width']}]"
    return [d], d


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="softcap",
    what="squashes values smoothly into (-cap, cap)",
    formula="y = cap · tanh(x / cap)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("softcap", "default", "the correct kernel", from_file("softcap")),),
)
