"""delta_decay: the gated delta net's log-decay per head and token, g = softplus(alpha + dt_bias) · A.

A is the file's `ssm_a`, -exp(A_log), so g < 0 and the state decays by e^g < 1 each token
(llama.cpp's `gate`). Three faults from the engines' trackers, each one part file: the softplus
skipped (a kernel that assumes its caller applied it), dt_bias added twice (once in a fused
projection and again here), and A used without its minus sign (A_log's exp taken as A)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose
from labkit.ops.ssm_scan import softplus

PARAMS = Params(n="u32", n_head="u32")


def reference(stage, ref) -> np.ndarray:
    A, bias = ref.weight(stage.weight).ravel(), ref.weight(stage.bias).ravel()
    return softplus(ref.x[0] + bias) * A


def plan(stage, gpu):
    alpha = gpu.input(0)
    out = gpu.output(alpha.shape)
    values = {"n": alpha.size, "n_head": stage.params["n_head"]}
    gpu.dispatch([alpha.buffer, gpu.vector(stage.bias), gpu.vector(stage.weight), out.buffer], values,
                 ceil_div(alpha.size, 64))  # fmt: skip
    return out


def shapes(stage) -> tuple[list[str], str]:
    H = stage.params["n_head"]
    return [f"alpha [T, {H}]", f"{stage.bias} [{H}]", f"{stage.weight} [{H}]"], f"[T, {H}]"


def _with(*parts: str):
    return lambda shape: compose("delta_decay", *parts)


CORRECT = ("delta_decay_softplus", "delta_decay_bias", "delta_decay_sign")
OP = Op(
    output=lambda st, s: (s.T, st.params["n_head"]),
    name="delta_decay",
    what="the delta rule's log-decay per head: how much of the state each token keeps (e^g of it)",
    formula="g = softplus(alpha + dt_bias) · A,  A = -exp(A_log) < 0",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(
        Kernel("delta_decay", "default", "the correct kernel", _with(*CORRECT)),
        Kernel(
            "delta_decay",
            "no_softplus",
            "FAULTY: alpha + dt_bias used without its softplus (a kernel that assumes its caller applied it; "
            "flash-linear-attention #63 is that split gone wrong)",
            _with("delta_decay_no_softplus", "delta_decay_bias", "delta_decay_sign"),
            faulty=True,
        ),
        Kernel(
            "delta_decay",
            "dt_bias_twice",
            "FAULTY: dt_bias added twice (once where a fused projection already added it: flash-linear-attention "
            "#63 added Mamba-2's dt_bias before a kernel that adds it too; mlx-lm #1792 misreads this gate's bias)",
            _with("delta_decay_softplus", "delta_decay_bias_twice", "delta_decay_sign"),
            faulty=True,
        ),
        Kernel(
            "delta_decay",
            "a_positive",
            "FAULTY: A used without its minus sign, so the state grows each token instead of decaying "
            "(state-spaces/mamba #326)",
            _with("delta_decay_softplus", "delta_decay_bias", "delta_decay_unsigned"),
            faulty=True,
        ),
    ),
)
