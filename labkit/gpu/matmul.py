"""Quantized matmul on the GPU: Y[t, n] = sum_k W[n, k] * X[t, k], W in its GGUF format.

A matmul module is composed from three kernel files (see the top of kernels/matmul.wgsl
for the driver interface): common.wgsl + quant_<fmt>.wgsl + a driver. `prepare_matmul`
returns one `Dispatch` per weight window; record them with `labkit.gpu.dispatch.encode`.
"""

from __future__ import annotations

import re
from typing import Any

from gguf import GGMLQuantizationType

from labkit.errors import UnsupportedTensorTypeError
from labkit.gpu.dispatch import Dispatch, bind, grid, uniform
from labkit.gpu.shader import compile_pipeline, compose
from labkit.gpu.weights import GpuWeight

FORMATS = {
    GGMLQuantizationType.F32: "f32",
    GGMLQuantizationType.F16: "f16",
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
    GGMLQuantizationType.Q5_0: "q5_0",
    GGMLQuantizationType.Q4_K: "q4_k",
    GGMLQuantizationType.Q5_K: "q5_k",
    GGMLQuantizationType.Q6_K: "q6_k",
}

# driver name -> kernel file
DRIVERS = {"row": "matmul", "matmul": "matmul", "wg_reduce": "matmul_wg_reduce"}

PARAMS_FMT = "<8I"  # K, rows, T, row0, x_offset, x_stride, y_offset, y_stride


def format_name(ggml_type: int) -> str:
    """'q8_0', 'q4_k', ... for a supported ggml type; UnsupportedTensorTypeError otherwise."""
    try:
        return FORMATS[GGMLQuantizationType(ggml_type)]
    except (KeyError, ValueError):
        try:
            name = GGMLQuantizationType(ggml_type).name
        except ValueError:
            name = "unknown"
        raise UnsupportedTensorTypeError(
            f"no GPU matmul for ggml type {ggml_type} ({name}); supported: " + ", ".join(t.name for t in FORMATS)
        ) from None


def default_driver(gpu: Any | None = None) -> str:
    """'row' (one row per thread) on CPU adapters, 'wg_reduce' on real GPUs."""
    if gpu is None:
        from labkit.gpu.device import get_device

        gpu = get_device()
    return "row" if gpu.adapter_type == "CPU" else "wg_reduce"


def matmul_source(ggml_type: int, driver: str = "default", quant_variant: str = "default") -> str:
    """The composed WGSL: common + quant_<fmt>[_<quant_variant>] + the driver's file.

    driver: "default" (by adapter type), "row", "wg_reduce", or NAME for matmul_NAME.wgsl.
    """
    fmt = format_name(ggml_type)
    if driver == "default":
        driver = default_driver()
    drv = DRIVERS.get(driver, f"matmul_{driver}")
    quant = f"quant_{fmt}" if quant_variant == "default" else f"quant_{fmt}_{quant_variant}"
    return compose("common", quant, drv)


def _const(source: str, name: str, default: int) -> int:
    m = re.search(rf"\bconst\s+{name}\s*(?::\s*u32\s*)?=\s*(\d+)u?\s*;", source)
    return int(m.group(1)) if m else default


def driver_geometry(source: str) -> tuple[int, int]:
    """(ROWS_PER_WG, TOKENS_PER_WG) declared by a driver source (default 64, 8)."""
    return _const(source, "ROWS_PER_WG", 64), _const(source, "TOKENS_PER_WG", 8)


def _qk(source: str) -> int:
    return _const(source, "QK", 1)


def prepare_matmul(
    gpu: Any,
    weight: GpuWeight,
    x: Any,
    y: Any,
    T: int,
    x_offset: int = 0,
    x_stride: int | None = None,
    y_offset: int = 0,
    y_stride: int | None = None,
    source: str | None = None,
) -> list[Dispatch]:
    """One dispatch per window computing Y[y_offset + t*y_stride + n] for all rows n, t < T."""
    fmt = format_name(weight.ggml_type)
    K, N = weight.n_cols, weight.n_rows
    x_stride = K if x_stride is None else int(x_stride)
    y_stride = N if y_stride is None else int(y_stride)
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    need_x = (x_offset + (T - 1) * x_stride + K) * 4
    need_y = (y_offset + (T - 1) * y_stride + N) * 4
    if x.size < need_x:
        raise ValueError(f"{weight.name}: X buffer has {x.size} bytes, {need_x} needed")
    if y.size < need_y:
        raise ValueError(f"{weight.name}: Y buffer has {y.size} bytes, {need_y} needed")
    if source is None:
        source = matmul_source(weight.ggml_type)
    qk = _qk(source)
    if qk > 4 and K % qk:
        raise UnsupportedTensorTypeError(f"{weight.name}: K={K} is not a multiple of {qk}")
    rows_per_wg, tokens_per_wg = driver_geometry(source)
    pipeline = compile_pipeline(gpu, source, label=f"matmul_{fmt}")
    tiles = -(-T // tokens_per_wg)
    out = []
    for w in weight.windows:
        params = uniform(gpu, PARAMS_FMT, K, w.n_rows, T, w.first_row, x_offset, x_stride, y_offset, y_stride)
        bg = bind(gpu, pipeline, [w.buffer, x, y, params])
        n_wg = -(-w.n_rows // rows_per_wg) * tiles
        label = f"matmul {weight.name}[{w.first_row}:{w.first_row + w.n_rows}] T={T}"
        out.append(Dispatch(pipeline, bg, grid(n_wg, gpu.max_workgroups), label))
    return out
