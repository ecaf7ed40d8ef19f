"""Sampling with the full-vocabulary softmax on the GPU.

softmax(z/T) restricted to the top-k and renormalized equals softmax over the
top-k logits, so temperature → top-k → softmax → top-p (llama.cpp's order) can
take the expensive full-vocabulary softmax from the GPU and finish on the host.
"""

from __future__ import annotations

import numpy as np

from labkit.gpu.dispatch import Dispatch, bind, grid, uniform
from labkit.gpu.executor import STORAGE, GpuExecutor
from labkit.gpu.variants import PassShape
from labkit.sampling import Sampler


class GpuSampler:
    def __init__(self, executor: GpuExecutor, sampler: Sampler):
        self.ex, self.sampler = executor, sampler

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """softmax(logits / temperature) over the whole vocabulary, on the GPU."""
        ex, dev = self.ex, self.ex.device
        z = np.ascontiguousarray(logits, dtype=np.float32)
        n = z.size
        src = dev.create_buffer_with_data(data=z.tobytes(), usage=STORAGE)
        scaled, out = ex.buffer(n, "sample.scaled"), ex.buffer(n, "sample.probs")
        shape = PassShape(1, 0)
        pipe_s, pipe_m = ex.pipeline("embed", shape), ex.pipeline("softmax", shape)
        inv_t = 1.0 / max(self.sampler.temperature, 1e-8)
        ds = Dispatch(
            pipe_s,
            bind(ex.gpu, pipe_s, [src, scaled, uniform(ex.gpu, "<IfII", n, inv_t, 0, 0)]),
            grid(-(-n // 64)),
            "sample.scale",
        )
        dm = Dispatch(
            pipe_m,
            bind(ex.gpu, pipe_m, [scaled, out, uniform(ex.gpu, "<IIII", 1, n, 0, 0)]),
            grid(1),
            "sample.softmax",
        )
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for d in (ds, dm):
            cp.set_pipeline(d.pipeline)
            cp.set_bind_group(0, d.bind_group)
            cp.dispatch_workgroups(*d.workgroups)
        cp.end()
        dev.queue.submit([enc.finish()])
        return np.frombuffer(dev.queue.read_buffer(out, 0, 4 * n), dtype=np.float32).astype(np.float64)

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The correct order with its full-vocabulary softmax on the GPU; a faulty sampling
        variant runs its own (host) order instead."""
        s = self.sampler
        if s.variant != "default":
            return s.distribution(logits)
        p = self.probs(logits)
        ids = np.argsort(-p, kind="stable")
        if s.top_k > 0:
            ids = ids[: s.top_k]
        q = p[ids] / p[ids].sum()
        if s.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(q), s.top_p) + 1)
            ids, q = ids[:keep], q[:keep] / q[:keep].sum()
        return ids, q

    def __call__(self, logits: np.ndarray) -> int:
        if self.sampler.greedy:
            return int(np.argmax(logits))
        return self.sampler.draw(self.distribution(logits))
