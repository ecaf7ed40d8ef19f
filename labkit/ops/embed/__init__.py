"""embed: the token's row of the embedding matrix, times a scale (Gemma: sqrt(d_model)).

Only the rows of this pass's tokens are read from the memory-mapped file (never the whole
178 MB table); the kernel applies the scale on the GPU."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", scale="f32")


def reference(stage, ref) -> np.ndarray:
    return ref.rows(stage.weight, ref.ids) * stage.params["scale"]


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    rows = gpu.token_rows(stage.weight)
    out = gpu.output((gpu.T, rows.size // gpu.T))
    gpu.dispatch([rows.buffer, out.buffer], {"n": out.size, "scale": stage.params["scale"]}, workgroups(out.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    return [f"{stage.weight} rows of the token ids"], f"[T, {stage.params['d_model']}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["d_model"]),
    name="embed",
    what="looks up each token's row of the embedding matrix and scales it",
    formula="x[t] = E[id[t]] · scale",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="rows",
    kernels=(Kernel("embed", "default", "the correct kernel", from_file("scale")),),
)
