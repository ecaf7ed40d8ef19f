"""ssm_conv: the causal conv1d of a recurrent mixer (Mamba-2's over x, B and C; the gated delta net's
over q, k and v), continuing the layer's conv state.

Each channel's output at a token is the dot product of its d_conv weights with its last d_conv
inputs: the d_conv - 1 it kept from earlier passes (the conv state), then this pass's. Plus the
conv's bias where it has one (Mamba-2's; the delta net's has none), through SiLU, as llama.cpp's
ggml_ssm_conv, ggml_add and ggml_silu compute it. The state left for the next pass is each
channel's last d_conv - 1 inputs, laid out as llama.cpp's cache_r holds it ([channels,
d_conv - 1], taps fastest)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose
from labkit.ops.glu import silu

PARAMS = Params(T="u32", channels="u32", d_conv="u32", has_bias="u32")


def conv_window(x: np.ndarray, state: np.ndarray, d_conv: int) -> np.ndarray:
    """[channels, d_conv - 1 + T]: the kept inputs, then this pass's (llama.cpp's conv_x)."""
    return np.concatenate([state.reshape(x.shape[1], d_conv - 1), x.T], axis=1)


def causal_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(silu(conv + b) [T, channels], the new state [channels, d_conv - 1]) in float64."""
    T, d_conv = x.shape[0], w.shape[1]
    win = conv_window(x, state, d_conv)
    taps = np.lib.stride_tricks.sliding_window_view(win, d_conv, axis=1)  # [channels, T, d_conv]
    y = np.einsum("ctk,ck->tc", taps, w) + b
    return silu(y), win[:, T:].copy()


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    w = ref.weight(stage.weight).reshape(P["channels"], P["d_conv"])
    state = ref.state("conv", (P["channels"], P["d_conv"] - 1))
    bias = ref.weight(stage.bias).ravel() if stage.bias else np.zeros(P["channels"])
    y, new = causal_conv(ref.x[0], w, bias, state)
    ref.set_state("conv", new)
    return y


def workgroups(channels: int) -> int:
    return ceil_div(channels, 64)


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    P = stage.params
    values = {"T": gpu.T, "channels": P["channels"], "d_conv": P["d_conv"], "has_bias": int(stage.bias is not None)}
    bias = gpu.vector(stage.bias or stage.weight)  # bound but never read without a bias
    operands = [x.buffer, gpu.vector(stage.weight), bias, gpu.state("conv"), out.buffer]
    gpu.dispatch(operands, values, workgroups(P["channels"]))
    return out


def shapes(stage) -> tuple[list[str], str]:
    c, k = stage.params["channels"], stage.params["d_conv"]
    return [f"[T, {c}]", f"{stage.weight} [{c}, {k}]", f"conv state [{c}, {k - 1}]"], f"[T, {c}]"


def _with(part: str):
    return lambda shape: compose("ssm_conv", part)


OP = Op(
    output=lambda st, s: (s.T, st.params["channels"]),
    name="ssm_conv",
    what="a causal convolution over each channel's last d_conv inputs (the conv state, then this pass's), "
    "plus a bias where it has one, through SiLU",
    formula="y[t, c] = silu(Σ_i w[c, i] · x[t - d_conv + 1 + i, c] + b[c]);  state = the last d_conv - 1 inputs",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(
        Kernel("ssm_conv", "default", "the correct kernel, one thread a channel", _with("ssm_conv_state")),
        Kernel(
            "ssm_conv",
            "state_lag",
            "FAULTY: the conv state kept one token behind (llama.cpp #23827's class: the window saved before its "
            "last shift), so the next pass's first d_conv - 1 outputs read a stale input; one pass is right",
            _with("ssm_conv_state_lag"),
            faulty=True,
        ),
    ),
)
