"""The matmul at the widths of the models people debug (896 to 14336), for Q4_K, Q5_K and Q6_K, in both
GPU layouts: `blocks` (the default: the GGUF blocks in textures) and `repacked` (int8). Decode
(T = 1, the matvec) and prefill (T = 64, the 16x8 tiles), on random valid blocks, with numpy's
float32 product on the dequantized matrix as the yardstick, all in one run. Prints the host CPU:
lavapipe's speed moves 2-3x with it.

Each row is one weight of an [N, K] shape from Qwen2.5-0.5B (896 rows, 4864 wide), Llama-3.2-1B (2048,
8192), Llama-3.2-3B (3072) and Llama-3.1-8B (4096, 14336). Times are the best of 5 submits
(each waited for); GB/s counts the layout's own bytes.

    .venv/bin/python benchmarks/bench_matmul_widths.py [--tokens 1,64]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import wgpu
from bench_matmul import gpu_seconds  # this folder: run as a script
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from labkit.bench import cpu_model
from labkit.gpu.device import get_device
from labkit.gpu.matmul import prepare_matmul
from labkit.gpu.repack import repack_weight
from labkit.gpu.weights import upload_weight
from labkit.ops.base import PassShape
from labkit.ops.registry import get_kernel

Q = GGMLQuantizationType
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
SHAPES = [  # (N, K): a weight's rows and its width (K-quants need K % 256 == 0: Qwen's 896 has none)
    (896, 4864),
    (2048, 2048), (8192, 2048), (2048, 8192),
    (3072, 3072), (8192, 3072),
    (4096, 4096), (14336, 4096), (4096, 14336),
]  # fmt: skip
F16_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # the f16 scales, kept finite


def random_blocks(rng: np.random.Generator, qtype: Q, n_rows: int, n_cols: int) -> np.ndarray:
    """Random valid GGUF bytes: random quants, small finite f16 scales."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_rows * n_cols // block, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        halves = (rng.uniform(0.25, 1.0, raw.shape[0]) * 0.01).astype(np.float16)
        raw[:, off : off + 2] = halves.view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


def one_shape(gpu, rng, qtype: Q, N: int, K: int, tokens: list[int]) -> list[str]:
    raw = random_blocks(rng, qtype, N, K)
    uploaded = upload_weight(gpu, "w", raw, int(qtype), N, K)
    w = dequantize(raw.reshape(N, -1), qtype).reshape(N, K).astype(np.float32)
    lines = []
    layouts = {}
    for name in ("blocks", "repacked"):
        kernel = get_kernel(f"matmul_{qtype.name.lower()}", name, "cpu")
        layouts[name] = (kernel, repack_weight(gpu, uploaded, kernel.repack()))
    for T in tokens:
        x = rng.standard_normal((T, K)).astype(np.float32)
        xb = gpu.device.create_buffer_with_data(data=x.tobytes(), usage=STORAGE)
        yb = gpu.device.create_buffer(size=4 * T * N, usage=STORAGE)
        t0 = time.perf_counter()
        for _ in range(3):
            x @ w.T
        numpy_s = (time.perf_counter() - t0) / 3
        cells = []
        for name, (kernel, weight) in layouts.items():
            src = kernel.source(PassShape(T, 0))
            s = gpu_seconds(gpu, prepare_matmul(gpu, weight, xb, yb, T, source=src), yb, repeat=5)
            nbytes = sum(win.nbytes for win in weight.windows)
            cells.append(f"{name} {s * 1e3:7.2f} ms {nbytes / s / 1e9:5.1f} GB/s")
            got = np.frombuffer(gpu.queue.read_buffer(yb), np.float32).reshape(T, N)
            want = x.astype(np.float64) @ w.T.astype(np.float64)
            nmse = float(np.sum((got - want) ** 2) / np.sum(want**2))
            assert nmse < 1e-9, f"{qtype.name} {N}x{K} T={T} {name}: nmse {nmse:.3g}"
        lines.append(
            f"{qtype.name} {N:6d}x{K:<6d} T={T:<3d} " + " | ".join(cells) + f" | numpy f32 {numpy_s * 1e3:7.2f} ms"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    gpu, rng = get_device(), np.random.default_rng(0)
    print(f"host CPU {cpu_model()}; lavapipe; best of 5; GB/s of each layout's own bytes", flush=True)
    for qtype in (Q[name] for name in args.types.split(",")):
        for N, K in SHAPES:
            for line in one_shape(gpu, rng, qtype, N, K, tokens):
                print(line, flush=True)


if __name__ == "__main__":
    main()
