"""Quantized matmul kernels against numpy on the real weights: each format's first tensor in the
real models and Gemma's unembedding, decode (T=1) and T=256, GPU time (best wall time of
submit + wait over 3, with the GFLOP/s and GB/s of GGUF bytes) vs numpy on the dequantized matrix
in float32 and float64, in the same run.

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
from labkit.ops import OPS
from labkit.ops.base import PassShape

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
    """Each format's first 2-D tensor, and Gemma's unembedding, through the kernel `lab.run` selects
    (repacked on a CPU adapter: matvec for T = 1, tiled above), against numpy in float32 and float64."""
    print(f"{'model':13} {'tensor':26} {'type':5} {'T':>4} {'gpu ms':>9} {'GFLOP/s':>8} {'GB/s':>6} "
          f"{'f32 ms':>8} {'f64 ms':>8} {'gpu/f64':>8}")  # fmt: skip
    for model in ("gemma3-270m", "smollm2-135m"):
        lab = labkit.open(model)
        ex = lab.executor
        seen = set()
        for st in lab.graph:
            if OPS[st.op].weight != "matrix":
                continue
            t = lab.gguf.tensors[st.weight]
            if (t.type_name in seen or t.type_name == "F32") and st.name != "logits":
                continue
            seen.add(t.type_name)
            kernel = ex.kernel(st)
            w = ex.repacked(st.weight, None, kernel.repack()) if kernel.repack else ex.weight(st.weight)
            dense = dequantize(lab.gguf.raw(st.weight), t.ggml_type, t.shape).reshape(t.n_rows, t.n_cols)
            for T in (1, 256):
                x = np.random.default_rng(0).standard_normal((T, t.n_cols)).astype(np.float32)
                xb = ex.device.create_buffer_with_data(data=x.tobytes(), usage=STORAGE)
                yb = ex.device.create_buffer(size=4 * T * t.n_rows, usage=STORAGE)
                src = kernel.source(PassShape(T, 0))
                dsp = prepare_matmul(ex.gpu, w, xb, yb, T, source=src, max_binding=ex.binding_limit)
                g = gpu_seconds(ex.gpu, dsp, yb)
                f32, f64 = numpy_seconds(x, dense.astype(np.float32)), numpy_seconds(x.astype(np.float64), dense)
                flops, nbytes = 2.0 * T * t.n_rows * t.n_cols, t.nbytes
                print(f"{model:13} {st.weight:26} {t.type_name:5} {T:4} {1e3 * g:9.2f} {flops / g / 1e9:8.1f} "
                      f"{nbytes / g / 1e9:6.2f} {1e3 * f32:8.2f} {1e3 * f64:8.2f} {g / f64:8.2f}")  # fmt: skip


def numpy_seconds(x: np.ndarray, dense: np.ndarray, repeat: int = 3) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        x @ dense.T
    return (time.perf_counter() - t0) / repeat


if __name__ == "__main__":
    main()
