"""llama.cpp's 8-bit activations: what a quantized matmul's input becomes before the dot products.

ggml's CPU backend converts a matmul's input to the weight type's `vec_dot_type` first
(ggml-cpu.c `type_traits_cpu`): Q8_0 blocks of 32 for Q4_0, Q5_0, Q8_0 and IQ4_NL, Q8_1
(the same values, with a block sum) for Q4_1 and Q5_1, Q8_K blocks of 256 for the K- and
most I-quants, and f16 or bf16 for those weight types. The integer dot products after that
are exact, so the input's rounding is the whole of the matmul's own error (quantize_row_q8_0
and quantize_row_q8_K_ref in ggml-quants.c: a Q8_0 scale is amax/127 stored in f16, a Q8_K
scale is max/-127 with the sign of the largest value, stored in f32).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from labkit.attribution.rounding import to_bf16, to_f16, to_f32

_Q8_0 = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1, Q.IQ4_NL}
_Q8_K = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS,
         Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.TQ2_0}  # fmt: skip


def q8_0(x: np.ndarray) -> np.ndarray:
    """Rows of x through Q8_0 blocks of 32 and back (K a multiple of 32)."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.round(b / np.where(d > 0, d, 1)), 0)
    return (q * to_f16(d)).reshape(x.shape)


def q8_k(x: np.ndarray) -> np.ndarray:
    """Rows of x through Q8_K blocks of 256 and back (K a multiple of 256)."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 256)
    idx = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, idx, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
        q = np.minimum(127, np.round(iscale * b))
        d = np.where(iscale != 0, np.float32(1) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
    return (q * d).reshape(x.shape)


def activation_rounding(weight_type: int, k: int):
    """The function llama.cpp's CPU matmul applies to its input for a weight of this type and width."""
    if weight_type in _Q8_K and k % 256 == 0:
        return q8_k
    if weight_type in _Q8_0 or weight_type in _Q8_K:
        return q8_0 if k % 32 == 0 else to_f32
    return {Q.F16: to_f16, Q.BF16: to_bf16}.get(weight_type, to_f32)
