"""l2norm: each head's q or k divided by its L2 norm, as the gated delta net reads them.

llama.cpp's build_gdn_l2_norm computes it as rms_norm(x, eps/n) · 1/sqrt(n), which is
x / sqrt(Σx² + eps) with eps the file's rms epsilon. The heads are read where they lie in the
conv's output (q at column 0, k after it), so no copy of them is made. The fault `unnormed`
leaves them as they are: a delta rule on unnormed keys writes with a strength that grows with
their size, and the state blows up over a prompt."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose

PARAMS = Params(n_groups="u32", group="u32", per_row="u32", stride="u32", offset="u32", eps="f32")


def l2norm(x: np.ndarray, group: int, eps: float) -> np.ndarray:
    g = x.reshape(x.shape[0], -1, group)
    return (g / np.sqrt(np.sum(g * g, axis=-1, keepdims=True) + eps)).reshape(x.shape)


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    x = ref.x[0][:, P["offset"] : P["offset"] + P["width"]]
    return l2norm(x, P["group"], P["eps"])


def plan(stage, gpu):
    P = stage.params
    x = gpu.input(0)
    out = gpu.output((gpu.T, P["width"]))
    per_row = P["width"] // P["group"]
    values = {"n_groups": gpu.T * per_row, "group": P["group"], "per_row": per_row, "stride": x.shape[-1],
              "offset": P["offset"], "eps": P["eps"]}  # fmt: skip
    gpu.dispatch([x.buffer, out.buffer], values, ceil_div(gpu.T * per_row, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"columns {P['offset']}..{P['offset'] + P['width']} of [T, {P['channels']}]"], f"[T, {P['width']}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="l2norm",
    what="divides each head's vector by its length, so the delta rule's keys and queries are unit vectors",
    formula="y = x / sqrt(Σ x² + eps)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel(
            "l2norm", "default", "the correct kernel, one thread a head", lambda s: compose("l2norm", "l2norm_scale")
        ),
        Kernel(
            "l2norm",
            "unnormed",
            "FAULTY: q and k left unnormed (a port that drops the L2 norm the delta rule assumes: its writes then "
            "grow with the keys' size; transformers #40842 fixed Qwen3-Next's norm that differed from the kernel's)",
            lambda s: compose("l2norm", "l2norm_unnormed"),
            faulty=True,
        ),
    ),
)
