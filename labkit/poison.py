"""The debug-mode poison: the bit pattern the GPU executor writes into every output region before a
pass, and how a capture counts the elements still holding it (never written by the kernel).

A signalling-NaN pattern no kernel computes, so a count of it is a count of unwritten elements.
It sits below both the executor (which writes it) and the captures (which report it)."""

from __future__ import annotations

import numpy as np

POISON_BITS = 0x7FBADBAD


def poison_count(a: np.ndarray) -> int:
    """Elements of a float32 (or int32 ids) array still holding POISON_BITS: never written by a debug pass."""
    a = np.asarray(a)
    if a.dtype not in (np.float32, np.int32):
        return 0
    return int(np.count_nonzero(np.ascontiguousarray(a).view(np.uint32) == POISON_BITS))
