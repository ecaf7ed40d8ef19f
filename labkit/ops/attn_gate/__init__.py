"""attn_gate: the attention's context times a sigmoid gate of its own (Qwen3.5, Qwen3-Next).

The gate is each head's second half of q_full (llama.cpp's `gate_reshaped`), so the heads'
context is scaled per dimension by sigmoid(gate) before the output projection (`attn_gated`)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file
from labkit.ops.sigmoid import sigmoid

PARAMS = Params(n="u32", head_dim="u32", n_heads="u32")


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    ctx, qf = ref.x
    T, H, d = ctx.shape[0], P["n_heads"], P["head_dim"]
    gate = qf.reshape(T, H, 2, d)[:, :, 1].reshape(T, H * d)
    return ctx * sigmoid(gate)


def plan(stage, gpu):
    P = stage.params
    ctx, qf = gpu.input(0), gpu.input(1)
    out = gpu.output(ctx.shape)
    values = {"n": ctx.size, "head_dim": P["head_dim"], "n_heads": P["n_heads"]}
    gpu.dispatch([ctx.buffer, qf.buffer, out.buffer], values, ceil_div(ctx.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    w = stage.params["n_heads"] * stage.params["head_dim"]
    return [f"context [T, {w}]", f"q_full [T, {2 * w}]"], f"[T, {w}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["n_heads"] * st.params["head_dim"]),
    name="attn_gate",
    what="gates the attention's output: each head's context times the sigmoid of the gate its query carried",
    formula="y = ctx · sigmoid(gate)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("attn_gate", "default", "the correct kernel", from_file("attn_gate")),),
)
