"""Random valid blocks of any GGUF type, for tests and real-shape files with random weights.

Random bytes are a valid block of most types once its f16 scales are finite. The exceptions get
their own writer here: scales that are not f16 (MXFP4's E8M0 byte, NVFP4's E4M3 bytes, IQ1_M's
f16 split over four nibbles) and TQ2_0, whose 2-bit digits stop at 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize


def write(fmt: Any, rng: np.random.Generator, n_blocks: int, scale: float) -> np.ndarray:
    """uint8 [n_blocks, fmt.block_bytes] for `fmt`, a QuantFormat (its kind, fields and sizes; not
    imported here, so that the record depends on this module and not the reverse): see
    QuantFormat.random_blocks."""
    if fmt.kind == "float":
        return _floats(fmt.qtype, rng, n_blocks * fmt.block_size, scale).reshape(n_blocks, -1)
    raw = rng.integers(0, 256, size=(n_blocks, fmt.block_bytes), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, n_blocks) * scale
    for off, factor in fmt.fields:
        raw[:, off : off + 2] = (d * factor).astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    special = _SPECIAL.get(fmt.qtype)
    if special is not None:
        special(raw, rng, d)
    return raw


def unit_std(fmt: Any, rng: np.random.Generator, n_blocks: int = 512) -> float:
    """The standard deviation of random blocks' values at scale 1: what a scale of s multiplies by s,
    so a writer can aim at a weight's size whatever the type."""
    return float(dequantize(write(fmt, rng, n_blocks, 1.0), fmt.qtype).std())


def _floats(qtype: Q, rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    v = (rng.standard_normal(n) * scale).astype(np.float32)
    if qtype == Q.F32:
        return v.view(np.uint8)
    if qtype == Q.F16:
        return v.astype("<f2").view(np.uint8)
    return (v.view("<u4") >> 16).astype("<u2").view(np.uint8)  # BF16: the top half, truncated


def _tq2_0(raw: np.ndarray, rng: np.random.Generator, d: np.ndarray) -> None:
    """Four 2-bit digits a byte, each 0..2 (3 would decode to 2d, which the quantizer never writes)."""
    digits = rng.integers(0, 3, size=(raw.shape[0], 64, 4), dtype=np.uint8)
    raw[:, :64] = digits[..., 0] | digits[..., 1] << 2 | digits[..., 2] << 4 | digits[..., 3] << 6


def _mxfp4(raw: np.ndarray, rng: np.random.Generator, d: np.ndarray) -> None:
    """E8M0 byte e: the block's values are kvalues · 2^(e − 128), kvalues up to ±12."""
    raw[:, 0] = np.clip(np.round(np.log2(d)) + 128, 2, 254).astype(np.uint8)


def _nvfp4(raw: np.ndarray, rng: np.random.Generator, d: np.ndarray) -> None:
    """Four unsigned E4M3 scales (bias 7, times 1/2): exponent near log2(2d), any mantissa."""
    e = np.clip(np.round(np.log2(2 * d))[:, None] + 7 + rng.integers(-1, 2, (raw.shape[0], 4)), 1, 14)
    raw[:, :4] = (e.astype(np.uint8) << 3) | rng.integers(0, 8, (raw.shape[0], 4), dtype=np.uint8)


def _iq1_m(raw: np.ndarray, rng: np.random.Generator, d: np.ndarray) -> None:
    """The f16 d goes in the top nibble of each of the 4 u16 scales at byte 48 (low nibble first)."""
    bits = d.astype("<f2").view("<u2")
    sc = raw[:, 48:56].copy().view("<u2") & np.uint16(0x0FFF)
    for i in range(4):
        sc[:, i] |= ((bits >> np.uint16(4 * i)) & np.uint16(0xF)) << np.uint16(12)
    raw[:, 48:56] = sc.view(np.uint8)


_SPECIAL = {Q.TQ2_0: _tq2_0, Q.MXFP4: _mxfp4, Q.NVFP4: _nvfp4, Q.IQ1_M: _iq1_m}
