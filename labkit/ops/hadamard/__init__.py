"""hadamard: each block of n values times the orthonormal Walsh-Hadamard matrix (llama.cpp's cache rotation).

Where llama.cpp keeps its K or V cache in a quantized type (and the heads are a multiple of 64 wide), it
rotates the queries and keys (and the values, turning the heads' context back after the mix) by a
Walsh-Hadamard matrix before the cache rounds them (llama.cpp #21038): q·k and the mix are unchanged, since
H is orthonormal and its own inverse, but an outlier's energy is spread over its block, so a block's scale
is no longer set by one value. labkit.model.cache_stages adds these stages (`q_rot`, `k_rot`, `v_rot`,
`attn_ctx_rot`) with the cache's type, so both engines round what llama.cpp rounds."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(count="u32", n="u32", x_offset="u32", y_offset="u32")


def matrix(n: int) -> np.ndarray:
    """ggml_gen_hadamard's n x n matrix (Sylvester's): H[i, j] = (-1)^popcount(i & j) / sqrt(n)."""
    i = np.arange(n)
    parity = np.vectorize(lambda v: bin(v).count("1") & 1)(i[:, None] & i[None, :])
    return (1.0 - 2.0 * parity) / np.sqrt(n)


def reference(stage, ref) -> np.ndarray:
    x = ref.x[0]
    n = stage.params["n"]
    return (x.reshape(-1, n) @ matrix(n)).reshape(x.shape)


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    values = {"count": x.size, "n": stage.params["n"], "x_offset": x.offset, "y_offset": out.offset}
    gpu.dispatch([x.buffer, out.buffer], values, ceil_div(x.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    w = f"[T, {stage.params['width']}]"
    return [w], f"{w}, each block of {stage.params['n']} rotated"


OP = Op(
    name="hadamard",
    what="rotates each block of n values by the Walsh-Hadamard matrix, as llama.cpp does before a quantized cache",
    formula="y[b] = H_n · x[b]  (H_n orthonormal, H_n² = I)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(Kernel("hadamard", "default", "the correct kernel", from_file("hadamard")),),
)
