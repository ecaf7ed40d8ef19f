"""rope: rotary position embedding, each pair of q or k features rotated by an angle that grows
with the position.

Neox style pairs feature i with i + rope_dim/2 (gemma, qwen, phi3); normal style pairs 2i
with 2i+1 (llama). Running one style's kernel on the other's model is post-mortem-style
fault `normal_pairs`. Roped keys are written straight into the KV cache (the stage's
`kv_write`)."""

from __future__ import annotations

import numpy as np

from labkit.errors import UnsupportedArchitectureError
from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(
    T="u32", n_heads="u32", head_dim="u32", rope_dim="u32", pos0="u32", neox="u32", base="f32", y_offset="u32"
)


def rope(
    x, positions, n_heads: int, head_dim: int, rope_dim: int, base: float, style: str, angle_dtype=np.float64
) -> np.ndarray:
    """Rotate pairs by pos·base^(-2i/rope_dim): neox pairs (i, i+d/2), normal pairs (2i, 2i+1).
    angle_dtype: what the angle pos·freq is computed in. Engines compute it in f32 (labkit's WGSL,
    llama.cpp, transformers' rotary embedding), whose rounding grows with the position: at
    position 512 an f32 angle is off by ~3e-5 rad, far more than the f32 rounding of q and k."""
    T = x.shape[0]
    h = x.reshape(T, n_heads, head_dim).copy()
    half = rope_dim // 2
    inv_freq = (base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)).astype(angle_dtype)
    ang = (positions[:, None].astype(angle_dtype) * inv_freq[None, :]).astype(np.float64)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if style == "neox":
        a, b = h[..., :half].copy(), h[..., half:rope_dim].copy()
        h[..., :half], h[..., half:rope_dim] = a * cos - b * sin, a * sin + b * cos
    elif style == "normal":
        a, b = h[..., 0:rope_dim:2].copy(), h[..., 1:rope_dim:2].copy()
        h[..., 0:rope_dim:2], h[..., 1:rope_dim:2] = a * cos - b * sin, a * sin + b * cos
    else:
        raise UnsupportedArchitectureError(f"unknown rope style {style!r}")
    return h.reshape(T, n_heads * head_dim)


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    angle = getattr(ref, "angle_dtype", np.float64)  # f32 where attribution emulates an engine
    return rope(ref.x[0], ref.positions, P["n_heads"], P["head_dim"], P["rope_dim"], P["base"], P["style"], angle)


def workgroups(n: int) -> int:
    return ceil_div(n, 64)


def plan(stage, gpu):
    P = stage.params
    x = gpu.input(0)
    out = gpu.output(x.shape)
    values = {
        "T": gpu.T,
        "n_heads": P["n_heads"],
        "head_dim": P["head_dim"],
        "rope_dim": P["rope_dim"],
        "pos0": gpu.n_past,
        "neox": int(P["style"] == "neox"),
        "base": P["base"],
        "y_offset": out.offset,
    }
    gpu.dispatch([x.buffer, out.buffer], values, workgroups(x.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['n_heads']}·{stage.params['head_dim']}]"
    return [d], d


OP = Op(
    output=lambda st, s: (s.T, st.params["n_heads"] * st.params["head_dim"]),
    name="rope",
    what="rotates pairs of features by an angle proportional to the token's position",
    formula="(a, b) → (a·cos θ − b·sin θ, a·sin θ + b·cos θ),  θ = pos · base^(−2i/d)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel("rope", "default", "the correct kernel (the model's own pairing)", from_file("rope")),
        Kernel(
            "rope",
            "normal_pairs",
            "normal (2i, 2i+1) rope whatever the model's style: wrong on neox models (gemma, qwen, phi3)",
            from_file("rope_normal_pairs"),
            faulty=True,
        ),
    ),
    per_step=True,
)
