"""ssm_skip: Mamba-2's skip term, the scan's y plus D times its input x (one D per head).

llama.cpp's `mamba2_y_add_d`: y + x · D, with x the conv's output (its first d_inner channels)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", head_dim="u32", channels="u32", d_inner="u32")


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    y, xbc = ref.x
    D = np.repeat(ref.weight(stage.weight).ravel(), P["d_inner"] // P["n_head"])
    return y + xbc[:, : P["d_inner"]] * D


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    P = stage.params
    y, xbc = gpu.input(0), gpu.input(1)
    out = gpu.output(y.shape)
    values = {"n": y.size, "head_dim": P["d_inner"] // P["n_head"], "channels": P["channels"], "d_inner": P["d_inner"]}
    gpu.dispatch([y.buffer, xbc.buffer, gpu.vector(stage.weight), out.buffer], values, workgroups(y.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"y [T, {P['d_inner']}]", f"xBC [T, {P['channels']}]", f"{stage.weight} [{P['n_head']}]"], (
        f"[T, {P['d_inner']}]"
    )


OP = Op(
    output=lambda st, s: (s.T, st.params["d_inner"]),
    name="ssm_skip",
    what="adds the skip term: the scan's input x times a learned D per head",
    formula="y' = y + D[h] · x",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(Kernel("ssm_skip", "default", "the correct kernel", from_file("ssm_skip")),),
)
