"""gated_norm: a grouped RMSNorm and a SiLU gate, in the order the family's mixer applies them.

Mamba-2 (llama.cpp's build_mamba2_layer) gates before the norm: rmsnorm(y · silu(z)) · w, over
groups of d_inner / n_group values, the weight one value per element (ssm_norm [n_group, group]).
Qwen3-Next's gated delta net norms first and gates after: rmsnorm(y) · w · silu(z). The fault
`gate_swapped` applies the gate on the other side of the norm."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose
from labkit.ops.glu import silu

PARAMS = Params(n_groups="u32", group="u32", eps="f32", gate_first="u32", w_groups="u32")


def gated_norm(y: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float, group: int, gate_first: bool) -> np.ndarray:
    """[T, width] → [T, width]: each group of `group` values normed; w holds width values (or a group's)."""
    v = y * silu(z) if gate_first else y
    g = v.reshape(v.shape[0], -1, group)
    normed = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps) * w.reshape(-1, group)
    out = normed.reshape(v.shape)
    return out if gate_first else out * silu(z)


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    return gated_norm(ref.x[0], ref.x[1], ref.weight(stage.weight), P["eps"], P["group"], P["gate"] == "before")


def workgroups(n_groups: int) -> int:
    return ceil_div(n_groups, 8)  # 8 groups a workgroup of 64 (gated_norm.wgsl)


def plan(stage, gpu):
    P = stage.params
    y, z = gpu.input(0), gpu.input(1)
    out = gpu.output(y.shape)
    n_groups = y.size // P["group"]
    values = {"n_groups": n_groups, "group": P["group"], "eps": P["eps"], "gate_first": int(P["gate"] == "before"),
              "w_groups": P.get("w_groups", P["width"] // P["group"])}  # fmt: skip
    gpu.dispatch([y.buffer, z.buffer, gpu.vector(stage.weight), out.buffer], values, workgroups(n_groups))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    w = f"[T, {P['width']}]"
    return [f"y {w}", f"z {w}", f"{stage.weight} [{P['width']}]"], w


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="gated_norm",
    what="a grouped RMSNorm with a SiLU gate from z: before the norm (Mamba-2) or after it (Qwen3-Next)",
    formula="y' = rmsnorm(y · silu(z)) · w   (gate after: rmsnorm(y) · w · silu(z))",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(
        Kernel(
            "gated_norm",
            "default",
            "the correct kernel, 8 threads a group",
            lambda s: compose("lanes8", "gated_norm", "gated_norm_order"),
        ),  # fmt: skip
        Kernel(
            "gated_norm",
            "gate_swapped",
            "FAULTY: the gate applied on the other side of the norm (after it where the model gates before, as a "
            "port of one family's norm to another would: flash-linear-attention #63, Mamba-2's inference path "
            "normed before gating where norm_before_gate is False)",
            lambda s: compose("lanes8", "gated_norm", "gated_norm_order_swapped"),
            faulty=True,
        ),
    ),
)
