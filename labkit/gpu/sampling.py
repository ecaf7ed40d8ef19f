"""Sampling with the full-vocabulary softmax on the GPU.

softmax(z/T) restricted to the top-k and renormalized equals softmax over the
top-k logits, so temperature → top-k → softmax → top-p (labkit.sampling's default) can
take the expensive full-vocabulary softmax from the GPU and finish on the host with
labkit.sampling.truncate. The scale and softmax kernels are always the correct ones:
a softmax variant selected for attention does not reach the sampler.
"""

from __future__ import annotations

import numpy as np

from labkit.gpu.dispatch import encode
from labkit.gpu.executor import STORAGE, GpuExecutor
from labkit.sampling import Sampler, ranked, truncate

SOFTMAX_ROW = {"n_rows": 1, "rows_per_head": 1, "sinks": 0}  # one row, no sink (its SINKS bound, unread)


class GpuSampler:
    def __init__(self, executor: GpuExecutor, sampler: Sampler):
        self.ex, self.sampler = executor, sampler

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """softmax(logits / temperature) over the whole vocabulary, on the GPU."""
        ex, dev = self.ex, self.ex.device
        z = np.ascontiguousarray(logits, dtype=np.float32)
        n = z.size
        src = dev.create_buffer_with_data(data=z.tobytes(), usage=STORAGE)
        objects = ex.gpu.fresh
        scaled, out = ex.buffer(n, "sample.scaled", objects), ex.buffer(n, "sample.probs", objects)
        inv_t = 1.0 / max(self.sampler.temperature, 1e-8)
        enc = dev.create_command_encoder()
        encode(
            enc,
            [
                ex.default_dispatch(
                    "embed", [src, scaled], {"n": n, "scale": inv_t}, -(-n // 64), "sample.scale", objects
                ),  # fmt: skip
                ex.default_dispatch(
                    "softmax", [scaled, out, scaled], SOFTMAX_ROW | {"n": n}, 1, "sample.softmax", objects
                ),  # fmt: skip
            ],
        )
        dev.queue.submit([enc.finish()])
        return np.frombuffer(dev.queue.read_buffer(out, 0, 4 * n), dtype=np.float32).astype(np.float64)

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The correct order with its full-vocabulary softmax on the GPU; a faulty sampling
        variant runs its own (host) order instead."""
        s = self.sampler
        if s.variant != "default":
            return s.distribution(logits)
        p = self.probs(logits)
        ids = ranked(p, s.top_k)
        return truncate(ids, p[ids], s.top_k, s.top_p)

    def __call__(self, logits: np.ndarray) -> int:
        if self.sampler.greedy:
            return int(np.argmax(logits))
        return self.sampler.draw(self.distribution(logits))
