"""glu: the gated feed-forward activation, act(gate) · up.

GELU (tanh approximation) for the Gemmas, SiLU for llama, qwen and phi3, and gpt-oss's clamped
SwiGLU (ggml's swiglu_oai, constants fixed in llama.cpp's graph): the gate clamped above at 7, the
up projection to ±7, then gate · sigmoid(1.702 gate) · (up + 1)."""

from __future__ import annotations

import math

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose

PARAMS = Params(n="u32", act="u32")
ACT_CODES = {"gelu_tanh": 0, "silu": 1, "swiglu_oai": 2}


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """x·x·x, not x**3: numpy's pow is ten times slower (the reference and attribution call it per layer)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x). Far below zero exp(-x) overflows to inf and x / inf is the exact limit, -0:
    no warning for it."""
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def swiglu_oai(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """alpha 1.702 and limit 7, fixed in llama.cpp's gpt-oss graph (no GGUF key); a gate far below
    zero gives silu's exact limit."""
    x = np.minimum(g, 7.0)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-1.702 * x)) * (np.clip(u, -7.0, 7.0) + 1.0)


ACTIVATIONS = {"gelu_tanh": gelu_tanh, "silu": silu}


def gated(act: str, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """act(g) · u, or swiglu_oai's clamped form."""
    return swiglu_oai(g, u) if act == "swiglu_oai" else ACTIVATIONS[act](g) * u


def reference(stage, ref) -> np.ndarray:
    return gated(stage.params["act"], ref.x[0], ref.x[1])


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    g, up = gpu.input(0), gpu.input(1)
    out = gpu.output(g.shape)
    values = {"n": g.size, "act": ACT_CODES[stage.params["act"]]}
    gpu.dispatch([g.buffer, up.buffer, out.buffer], values, workgroups(g.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['width']}]"
    return [d, d], d


OAI_FORMULA = "x = min(gate, 7); y = x · σ(1.702·x) · (clamp(up, −7, 7) + 1)   (gpt-oss's clamped SwiGLU)"

OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="glu",
    what="gates the up projection with the activated gate projection",
    formula="y = act(gate) · up   (act: GELU-tanh or SiLU)",
    formula_of=lambda st: OAI_FORMULA if st.params.get("act") == "swiglu_oai" else OP.formula,
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("glu", "default", "the correct kernel", lambda shape: compose("glu_act", "glu")),),
)
