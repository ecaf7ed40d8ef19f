"""The KV cache on the GPU: per-layer K (roped) and V buffers of `capacity` positions, and how many
of them hold tokens (`n_past`). A pass writes its tokens' K and V at n_past and then advances it;
a re-run of the same tokens (after `lab.use`) rewinds it first and writes the same positions."""

from __future__ import annotations

from dataclasses import dataclass

import wgpu


@dataclass
class GpuKVCache:
    capacity: int
    k: list[wgpu.GPUBuffer]
    v: list[wgpu.GPUBuffer]
    n_past: int = 0

    def advance(self, n: int) -> None:
        """A pass's n tokens are written: the next pass starts after them."""
        if self.n_past + n > self.capacity and self.k:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {self.n_past} + {n} do not fit")
        self.n_past += n

    def rewind(self, n: int) -> None:
        """The last pass's n tokens are to be written again (the same ids, re-run)."""
        if n > self.n_past:
            raise ValueError(f"cannot rewind {n} positions of a cache holding {self.n_past}")
        self.n_past -= n
