"""The KV cache's storage types, as llama.cpp's `--cache-type-k/-v` offers them, and their rounding in numpy.

llama.cpp writes each new K and V row into its cache with the type's `from_float` (ggml's
`quantize_row_<type>_ref`; for IQ4_NL the reference without the scale search, `ntry = -1`, which is what
its CPU cache write runs), and its attention reads the rounded values. `round_trip` is that write and read
in numpy, bit for bit: the float64 reference stores what it returns, so both engines attend over the same
rounded keys and values, and what a quantized cache costs in accuracy is a stage's difference of its own
(`blk.L.k_cache`), not noise spread over the attention.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

from labkit.errors import InvalidArgumentError

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
_GGML = {"f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0,
         "q5_1": T.Q5_1, "iq4_nl": T.IQ4_NL}  # fmt: skip
_BLOCK = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
          "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18)}  # values and bytes of one block  # fmt: skip
IQ4_NL_VALUES = np.array(quants.IQ4_NL.kvalues, np.float32)


def check_kv_type(name: str, what: str = "kv_type") -> str:
    """The type's name, lower-case; an InvalidArgumentError naming the types for anything else."""
    t = str(name).lower()
    if t not in KV_TYPES:
        raise InvalidArgumentError(f"{what}={name!r} is not a KV-cache type: give one of {', '.join(KV_TYPES)}")
    return t


def check_width(t: str, width: int, kind: str) -> None:
    """A cache row of `width` values must be whole blocks of the type (llama.cpp refuses it too)."""
    block = _BLOCK[t][0]
    if width % block:
        raise InvalidArgumentError(f"a {kind.upper()} cache row of {width} values is not whole {t} blocks of {block}")


def bytes_per_value(t: str) -> float:
    values, nbytes = _BLOCK[t]
    return nbytes / values


def row_bytes(t: str, width: int) -> int:
    """Bytes of one cache row of `width` values in type `t`, as llama.cpp stores it (no padding)."""
    values, nbytes = _BLOCK[t]
    return width // values * nbytes


def quantize_rows(x: np.ndarray, t: str) -> np.ndarray:
    """[rows, row_bytes] uint8: the rows written as llama.cpp's cache write writes them (from float32)."""
    x = np.ascontiguousarray(x, np.float32)
    if t == "f32":
        return x.view(np.uint8)
    if t == "f16":
        return x.astype(np.float16).view(np.uint8)
    if t == "iq4_nl":
        return _iq4_nl_rows(x)
    return quants.quantize(x, _GGML[t])


def dequantize_rows(b: np.ndarray, t: str, width: int) -> np.ndarray:
    """[rows, width] float32 of rows in type `t`."""
    if t == "f32":
        return np.ascontiguousarray(b).view(np.float32).reshape(-1, width)
    return quants.dequantize(np.ascontiguousarray(b, np.uint8), _GGML[t]).reshape(-1, width).astype(np.float32)


def round_trip(x: np.ndarray, t: str) -> np.ndarray:
    """The values a cache of type `t` gives back for rows `x` ([..., width]), as float64."""
    x = np.asarray(x)
    if t == "f32":
        return x.astype(np.float32).astype(np.float64)
    flat = x.reshape(-1, x.shape[-1])
    back = dequantize_rows(quantize_rows(flat, t), t, flat.shape[-1])
    return back.astype(np.float64).reshape(x.shape)


def _iq4_nl_rows(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_ref on float32 rows: each block's scale first from its largest value
    (`max / -127`), the nearest table entries at that scale, then the least-squares scale over them
    (weights x²), summed in order as the C loop sums."""
    blocks = x.reshape(-1, 32)
    n = blocks.shape[0]
    absx = np.abs(blocks)
    imax = absx.argmax(axis=1)
    mx = blocks[np.arange(n), imax]
    live = absx.max(axis=1) >= np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        d0 = mx / IQ4_NL_VALUES[0]
        idv = np.float32(1) / d0
    L = _best_index(np.where(live, idv, 0)[:, None] * blocks)
    q = IQ4_NL_VALUES[L]
    sumqx, sumq2 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for j in range(32):  # in order, as the C loop accumulates
        w = blocks[:, j] * blocks[:, j]
        sumqx = sumqx + w * q[:, j] * blocks[:, j]
        sumq2 = sumq2 + w * q[:, j] * q[:, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(live & (sumq2 > 0), sumqx / sumq2, np.float32(0)).astype(np.float32)
    L = np.where(live[:, None], L, 0).astype(np.uint8)
    qs = L[:, :16] | (L[:, 16:] << np.uint8(4))
    return np.concatenate([d.astype(np.float16).view(np.uint8).reshape(n, 2), qs], axis=1).reshape(x.shape[0], -1)


def _best_index(a: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 over IQ4_NL's table: the nearest entry, the lower one on a tie."""
    v = IQ4_NL_VALUES
    mu = np.clip(np.searchsorted(v, a, side="right"), 1, 15)
    lower = (a - v[mu - 1]) < (v[mu] - a)
    idx = np.where(lower, mu - 1, mu)
    return np.where(a <= v[0], 0, np.where(a >= v[15], 15, idx))
