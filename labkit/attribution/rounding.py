"""Rounding to the number formats engines store activations and weights in, and widening back.

Each function takes any float array and returns float32 (or float64 for float64) holding
exactly the values the narrower format can represent: what an engine that stores in that
format would read back. bfloat16 has no numpy dtype, so it is the top 16 bits of an f32,
rounded to nearest with ties to even, as torch rounds.
"""

from __future__ import annotations

import numpy as np


def to_f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def to_f16(a: np.ndarray) -> np.ndarray:
    """Through IEEE half: values past 65504 become inf, as they do in an f16 engine."""
    with np.errstate(over="ignore"):
        return np.asarray(a).astype(np.float16).astype(np.float32)


def to_bf16(a: np.ndarray) -> np.ndarray:
    """Through bfloat16 (8 significant bits, f32's range); NaN stays NaN."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    out = u.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, out)


def to_f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


ROUND = {"float64": to_f64, "float32": to_f32, "float16": to_f16, "bfloat16": to_bf16}
