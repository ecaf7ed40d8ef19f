"""What a sequence keeps on the GPU between passes: per attending layer, K (roped) and V buffers of
`capacity` positions, and how many of them hold tokens (`n_past`); per recurrent layer, its states
((kind, layer) -> buffer: Mamba-2's "conv" and "scan"), one size at any length. A pass writes its
tokens' K and V at n_past, advances the states in place, and then advances n_past; a re-run of the
same tokens (after `lab.use`) rewinds n_past first and writes the same positions.

A cache of a smaller type (`types`: "k"/"v" -> "q8_0", ...; labkit.ops.kv_cache) holds the type's blocks,
and each stage that reads it first reads its rows into `views[kind]`, an f32 buffer of `capacity` rows
shared by every layer (each reader fills it before it reads). `views["none"]` is a small buffer a load
binds where it reads no rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import wgpu


@dataclass
class GpuKVCache:
    capacity: int
    k: list[wgpu.GPUBuffer | None]  # by layer; None where the layer does not attend
    v: list[wgpu.GPUBuffer | None]
    n_past: int = 0
    states: dict[tuple[str, int], wgpu.GPUBuffer] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # kind -> type, where not f32
    views: dict[str, wgpu.GPUBuffer] = field(default_factory=dict)

    def advance(self, n: int) -> None:
        """A pass's n tokens are written: the next pass starts after them."""
        if self.n_past + n > self.capacity and any(b is not None for b in self.k):
            raise ValueError(f"the KV cache holds {self.capacity} positions; {self.n_past} + {n} do not fit")
        self.n_past += n

    def rewind(self, n: int) -> None:
        """The last pass's n tokens are to be written again (the same ids, re-run). The states are not
        rewound (they hold no history): only a sequence's start (`restart`) resets them."""
        if n > self.n_past:
            raise ValueError(f"cannot rewind {n} positions of a cache holding {self.n_past}")
        self.n_past -= n

    def restart(self, device) -> None:
        """Back to an empty sequence: no positions, every state zero (as a new cache's)."""
        self.n_past = 0
        if self.states:
            enc = device.create_command_encoder()
            for buf in self.states.values():
                enc.clear_buffer(buf)
            device.queue.submit([enc.finish()])

    def fork(self, device) -> GpuKVCache:
        """An independent copy in new buffers: the same positions and states (a prefix kept for
        several continuations, a verifier's base)."""
        enc = device.create_command_encoder()

        def copied(buf: wgpu.GPUBuffer | None) -> wgpu.GPUBuffer | None:
            if buf is None:
                return None
            new = device.create_buffer(size=buf.size, usage=buf.usage, label=f"{buf.label} (fork)")
            enc.copy_buffer_to_buffer(buf, 0, new, 0, buf.size)
            return new

        k, v = [copied(b) for b in self.k], [copied(b) for b in self.v]
        states = {key: copied(b) for key, b in self.states.items()}
        device.queue.submit([enc.finish()])
        return GpuKVCache(self.capacity, k, v, self.n_past, states, self.types, self.views)
