"""The memory bandwidth the adapter labkit uses reaches: what bounds a decode step that reads every
weight once (bytes per token over bytes per second)."""

from __future__ import annotations

import numpy as np


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second the WebGPU device labkit uses moves in a buffer-to-buffer copy of `nbytes`
    (read and written, so 2 x nbytes a copy), median of `repeats` timed copies after a warm-up, each
    submitted and waited for: the rate memory reaches on this adapter (lesson 06's decode bound)."""
    import time

    import wgpu

    from labkit.gpu.device import get_device
    from labkit.gpu.dispatch import wait_idle

    gpu = get_device()
    usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    src, dst = gpu.device.create_buffer(size=nbytes, usage=usage), gpu.device.create_buffer(size=nbytes, usage=usage)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        enc = gpu.device.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
        gpu.queue.submit([enc.finish()])
        wait_idle(gpu)
        times.append(time.perf_counter() - t0)
    src.destroy()
    dst.destroy()
    return 2 * nbytes / float(np.median(times[1:]))
