"""A Run's own reading of its captures (labkit.captures): statistics, unwritten counts per position."""

from __future__ import annotations

import numpy as np


def test_stats_count_unwritten_per_position():
    """Run.stats reads the poison pattern from the capture itself on a debug run, per position
    (and per query position for attention maps)."""
    from labkit.captures import POISON_BITS, Run

    a = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    a.view(np.uint32)[1, [0, 3]] = POISON_BITS
    a.view(np.uint32)[2, 4] = POISON_BITS
    s = np.zeros((2, 3, 3), dtype=np.float32)
    s.view(np.uint32)[1, 2, :2] = POISON_BITS
    caps = {"x": a, "blk.0.attn_scores": s}
    run = Run("m", "gpu", [1, 2, 3], list(caps), caps, unwritten={"x": 3, "blk.0.attn_scores": 2})
    assert [run.stats("x", pos=p).unwritten for p in (0, 1, 2, -1)] == [0, 2, 1, 1]
    assert run.stats("x").unwritten == 3
    assert [run.stats("blk.0.attn_scores", pos=p).unwritten for p in range(3)] == [0, 0, 2]
    # not a debug run (no poison was written): nothing can be called unwritten
    plain = Run("m", "gpu", [1, 2, 3], list(caps), caps)
    assert plain.stats("x", pos=1).unwritten == 0
