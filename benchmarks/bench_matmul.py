"""Quantized matmul kernels against numpy on the real weights: each format's first tensor in the
real models, decode (T=1) and a prompt-sized T, GPU time (best wall time of
submit + wait over 3) vs numpy on the dequantized float32 matrix, in the same run.

    .venv/bin/python benchmarks/bench_matmul.py
"""

from __future__ import annotations

import time

import numpy as np
import wgpu

import labkit
from labkit.gpu.dispatch import encode
from labkit.gpu.matmul import prepare_matmul
from labkit.model.dequant import dequantize

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def gpu_seconds(gpu, dispatches, out, repeat: int = 3) -> float:
    """Best wall time of submit + wait (a 4-byte read of the output waits for the queue)."""
    best = float("inf")
    for _ in range(repeat):
        enc = gpu.device.create_command_encoder()
        encode(enc, dispatches)
        t0 = time.perf_counter()
        gpu.queue.submit([enc.finish()])
        gpu.queue.read_buffer(out, 0, 4)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    print(f"{'model':13} {'tensor':26} {'type':5} {'T':>3} {'gpu ms':>9} {'numpy ms':>9} {'gpu/numpy':>9}")
    for model in ("gemma3-270m", "smollm2-135m"):
        lab = labkit.open(model)
        ex = lab.executor
        seen = set()
        for name, t in lab.gguf.tensors.items():
            if len(t.shape) != 2 or t.type_name in seen or t.type_name in ("F32",):
                continue
            seen.add(t.type_name)
            w = ex.weight(name)
            dense = dequantize(lab.gguf.raw(name), t.ggml_type, t.shape).astype(np.float32).reshape(t.n_rows, t.n_cols)
            for T in (1, 7):
                x = np.random.default_rng(0).standard_normal((T, t.n_cols)).astype(np.float32)
                xb = ex.device.create_buffer_with_data(data=x.tobytes(), usage=STORAGE)
                yb = ex.device.create_buffer(size=4 * T * t.n_rows, usage=STORAGE)
                dsp = prepare_matmul(ex.gpu, w, xb, yb, T)
                g = gpu_seconds(ex.gpu, dsp, yb)
                t0 = time.perf_counter()
                for _ in range(3):
                    x @ dense.T
                n = (time.perf_counter() - t0) / 3
                print(f"{model:13} {name:26} {t.type_name:5} {T:3} {1e3 * g:9.2f} {1e3 * n:9.2f} {g / n:9.2f}")


if __name__ == "__main__":
    main()
