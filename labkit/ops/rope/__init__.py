"""rope: rotary position embedding, each pair of q or k features rotated by an angle that grows
with the position.

Neox style pairs feature i with i + rope_dim/2 (gemma, qwen, phi3); normal style pairs 2i
with 2i+1 (llama). Running one style's kernel on the other's model is post-mortem-style
fault `normal_pairs`. Roped keys are written straight into the KV cache (the stage's
`kv_write`). A scaled model's angles follow ggml_rope_ext: every angle times `freq_scale`
(1/factor), and under YaRN (`ext_factor` 1) the dims below the correction range keep their
unscaled angle, a ramp between, and cos and sin times attn_factor·(1 + 0.1·ln(1/freq_scale))."""

from __future__ import annotations

import numpy as np

from labkit.errors import UnsupportedArchitectureError
from labkit.ops.base import Kernel, Op, Params, ceil_div, compose

PARAMS = Params(
    T="u32", n_heads="u32", head_dim="u32", rope_dim="u32", pos0="u32", neox="u32", base="f32", y_offset="u32",
    freq_scale="f32", ext_factor="f32", attn_factor="f32", corr_low="f32", corr_high="f32", has_factors="u32",
)  # fmt: skip


# plain RoPE's scaling params: what ggml_rope_ext leaves every angle and magnitude as (and what
# labkit.model.config.RopeScaling defaults to)
UNSCALED = {"freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": 1.0, "corr_dims": (0.0, 0.0)}


def scaling_of(params: dict) -> dict:
    """A rope stage's scaling params (ModelConfig.rope_scaling through the graph), unscaled if none."""
    return {k: params.get(k, v) for k, v in UNSCALED.items()}


def scaled_angles(ang: np.ndarray, scaling: dict) -> tuple[np.ndarray, float]:
    """ggml's rope_yarn on angles [T, rope_dim/2]: (the angles, the cos/sin magnitude); `scaling` is
    scaling_of(params), or {} for none."""
    if not scaling:
        return ang, 1.0
    s = scaling
    interp = s["freq_scale"] * ang
    if not s["ext_factor"]:
        return interp, s["attn_factor"]
    low, high = s["corr_dims"]
    y = (np.arange(ang.shape[-1]) - low) / max(0.001, high - low)
    mix = (1.0 - np.clip(y, 0.0, 1.0)) * s["ext_factor"]
    return interp * (1 - mix) + ang * mix, s["attn_factor"] * (1.0 + 0.1 * np.log(1.0 / s["freq_scale"]))


def rope(
    x, positions, n_heads: int, head_dim: int, rope_dim: int, base: float, style: str, angle_dtype=np.float64,
    scaling: dict | None = None, freq_factors: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Rotate pairs by pos·base^(-2i/rope_dim): neox pairs (i, i+d/2), normal pairs (2i, 2i+1).
    angle_dtype: what the angle pos·freq is computed in. Engines compute it in f32 (labkit's WGSL,
    llama.cpp, transformers' rotary embedding), whose rounding grows with the position: at
    position 512 an f32 angle is off by ~3e-5 rad, far more than the f32 rounding of q and k."""
    T = x.shape[0]
    h = x.reshape(T, n_heads, head_dim).copy()
    half = rope_dim // 2
    inv_freq = (base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)).astype(angle_dtype)
    ang = (positions[:, None].astype(angle_dtype) * inv_freq[None, :]).astype(np.float64)
    if freq_factors is not None:  # llama3's per-pair factors (rope_freqs.weight), before any scaling
        ang = ang / np.asarray(freq_factors, np.float64).reshape(-1)[None, :half]
    ang, mag = scaled_angles(ang, scaling or {})
    cos, sin = mag * np.cos(ang)[:, None, :], mag * np.sin(ang)[:, None, :]
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
    factors = ref.weight(P["freq_factors"]) if P.get("freq_factors") else None
    return rope(ref.x[0], ref.positions, P["n_heads"], P["head_dim"], P["rope_dim"], P["base"], P["style"], angle,
                scaling_of(P), factors)  # fmt: skip


SCALED_FORMULA = (
    "(a, b) → m·(a·cos θ − b·sin θ, a·sin θ + b·cos θ),  θ = pos · base^(−2i/d) / f_i / factor  (f_i: the "
    "file's per-pair rope_freqs, else 1; YaRN: the fast pairs ramp back to the unscaled angle, m = "
    "attn_factor·(1 + 0.1·ln factor))"
)


def rope_source(pairing: str, position: str = "rope_position", magnitude: str = "rope_magnitude") -> str:
    """The kernel: rope.wgsl with its pairing, position and YaRN magnitude parts (the model's, or a fault's)
    and the scaling part."""
    return compose("rope", pairing, position, magnitude, "rope_scale")


def workgroups(n: int) -> int:
    """64-thread workgroups for n values, a thread per pair (rope.wgsl)."""
    return ceil_div(n // 2, 64)


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
    sc = scaling_of(P)
    values |= {k: sc[k] for k in ("freq_scale", "ext_factor", "attn_factor")}
    values |= {"corr_low": sc["corr_dims"][0], "corr_high": sc["corr_dims"][1], "has_factors": int("freq_factors" in P)}
    factors = gpu.vector(P["freq_factors"]) if "freq_factors" in P else x.buffer  # x there, unread, if none
    gpu.dispatch([x.buffer, out.buffer, factors], values, workgroups(x.size))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[T, {stage.params['n_heads']}·{stage.params['head_dim']}]"
    return [d], d


OP = Op(
    output=lambda st, s: (s.T, st.params["n_heads"] * st.params["head_dim"]),
    name="rope",
    what="rotates pairs of features by an angle proportional to the token's position",
    formula="(a, b) → (a·cos θ − b·sin θ, a·sin θ + b·cos θ),  θ = pos · base^(−2i/d)",
    formula_of=lambda st: SCALED_FORMULA if {"freq_scale", "freq_factors"} & set(st.params) else OP.formula,
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel(
            "rope",
            "default",
            "the correct kernel (the model's own pairing)",
            lambda _: rope_source("rope_pairing"),
        ),
        Kernel(
            "rope",
            "normal_pairs",
            "normal (2i, 2i+1) rope whatever the model's style: wrong on neox models (gemma, qwen, phi3)",
            lambda _: rope_source("rope_normal_pairs"),
            faulty=True,
        ),
        Kernel(
            "rope",
            "neox_pairs",
            "rotation in halves (i, i + d/2) whatever the model's style: wrong on adjacent-pair models (llama, "
            "DeepSeek's rotary parts, whose converted weights are de-interleaved for it or not: "
            "HabanaAI/vllm-fork#2042, huggingface/transformers#39687)",
            lambda _: rope_source("rope_neox_pairs"),
            faulty=True,
        ),
        Kernel(
            "rope",
            "yarn_uncancelled",
            "YaRN's magnitude 1 + 0.1·ln(factor) kept in the rotation where the model cancels it to put mscale² in "
            "the softmax scale (DeepSeek): the rotary part of every score scaled by it twice more. llama.cpp before "
            "#17945 (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX), huggingface/transformers#47435 and onnxruntime/mobius#548 "
            "(the mscale correction placed in one of its two homes only)",
            lambda _: rope_source("rope_pairing", magnitude="rope_yarn_uncancelled"),
            faulty=True,
        ),
        Kernel(
            "rope",
            "positions_restart",
            "a pass of several tokens numbers them from 0, whatever was cached before it: every micro-batch "
            "after the first is rotated as if it began the sequence (transformers #43082); only a chunked or "
            "continued prompt shows it",
            lambda _: rope_source("rope_pairing", "rope_positions_restart"),
            faulty=True,
        ),
    ),
    step_fields=("pos0", "y_offset"),
    per_sequence=True,
)
