"""YaRN's correction dims (ggml_rope_yarn_corr_dims): the range of rotary dims over which YaRN
mixes each dim's scaled angle back to its unscaled one. Below both engines: the graph gives them to
the rope stage, and the reference and the kernel read them from its params."""

from __future__ import annotations

import math


def yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    """The dim whose wavelength turns `n_rot` times over `n_ctx_orig` positions."""
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """(low, high), floored and ceiled and clamped to [0, n_dims - 1] as ggml does."""
    low = math.floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base))
    high = math.ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base))
    return float(max(0, low)), float(min(n_dims - 1, high))
