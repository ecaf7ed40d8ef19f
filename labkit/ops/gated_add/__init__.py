"""gated_add: the mixture's output plus the shared expert's, scaled by a sigmoid gate per token.

Qwen3.5's MoE layers (and Qwen3-Next's) run a shared expert beside the routed ones and weigh it by
sigmoid(ffn_gate_inp_shexp · x), one number a token (llama.cpp's `shared_expert_gate`), where
ERNIE and DeepSeek add it as it is."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file
from labkit.ops.sigmoid import sigmoid

PARAMS = Params(n="u32", width="u32")


def reference(stage, ref) -> np.ndarray:
    moe, shared, logit = ref.x
    return moe + sigmoid(logit[:, :1]) * shared


def plan(stage, gpu):
    moe, shared, logit = gpu.input(0), gpu.input(1), gpu.input(2)
    out = gpu.output(moe.shape)
    values = {"n": moe.size, "width": moe.shape[-1]}
    gpu.dispatch([moe.buffer, shared.buffer, logit.buffer, out.buffer], values, ceil_div(moe.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    w = f"[T, {stage.params['width']}]"
    return [f"experts {w}", f"shared expert {w}", "gate logit [T, 1]"], w


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="gated_add",
    what="adds the shared expert's output to the mixture's, weighed by a sigmoid gate the token computes",
    formula="y = moe + sigmoid(g) · shared",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("gated_add", "default", "the correct kernel", from_file("gated_add")),),
)
