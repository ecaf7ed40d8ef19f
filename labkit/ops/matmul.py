"""matmul: a linear layer, y = x · Wᵀ (+ bias), with W read in its GGUF format on the GPU.

Weights stay as the file's bytes; a kernel is composed from common.wgsl, the format's
block reader (quant_<fmt>.wgsl, transcribed from ggml's dequantize_row_*) and a driver
(matmul.wgsl: rows per thread, fastest on CPU adapters; matmul_wg_reduce.wgsl: one
workgroup per row, for real GPUs). Each weight format is its own kernel family
(`matmul_q8_0`, `matmul_q4_k`, ...), so a format fault (Q4_K mins added) binds to exactly
the weights of that format. The unembedding stage carries the `lm_head` dispatch policy:
which row windows of the weight get dispatched (post-mortem 002 left the last one out).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from labkit.errors import UnsupportedTensorTypeError
from labkit.ops.base import Kernel, Op, Params, Policy, compose

PARAMS = Params(
    K="u32", rows="u32", T="u32", row0="u32", x_offset="u32", x_stride="u32", y_offset="u32", y_stride="u32"
)

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
DRIVERS = {"row": "matmul", "wg_reduce": "matmul_wg_reduce"}


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


def family(stage, tensor_type) -> str:
    """`matmul_<fmt>` of the stage's weight."""
    return "matmul_" + format_name(tensor_type(stage.weight))


def reference(stage, ref) -> np.ndarray:
    y = ref.x[0] @ ref.weight(stage.weight, stage.weight_rows).T
    return y + ref.weight(stage.bias) if stage.bias else y


def workgroups(rows: int, T: int, rows_per_wg: int, tokens_per_wg: int) -> int:
    """One workgroup per ROWS_PER_WG weight rows and TOKENS_PER_WG tokens (declared in the driver)."""
    return -(-rows // rows_per_wg) * -(-T // tokens_per_wg)


def plan(stage, gpu):
    x = gpu.input(0)
    lm_head = stage.policy == "lm_head"
    rows_T = 1 if lm_head and gpu.last_only else gpu.T
    out = gpu.output((rows_T, stage.params["out"]))
    keep = gpu.policy("lm_head").window_filter if lm_head else None
    gpu.matmul(x, out, rows_T, x_skip=gpu.T - rows_T, window_filter=keep)
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    rows = f" rows {stage.weight_rows[0]}:{stage.weight_rows[1]}" if stage.weight_rows else ""
    bias = [f"{stage.bias} [{P['out']}]"] if stage.bias else []
    return [f"[T, {P['in']}]", f"{stage.weight}{rows} [{P['out']}, {P['in']}]", *bias], f"[T, {P['out']}]"


def source(fmt: str, driver: str = "row", quant: str = "") -> str:
    """The composed WGSL of one matmul kernel: common + quant_<fmt>[_<quant>] + the driver."""
    return compose("common", f"quant_{fmt}" + (f"_{quant}" if quant else ""), DRIVERS.get(driver, driver))


def _kernels() -> tuple[Kernel, ...]:
    out = []
    for fmt in FORMATS.values():
        fam = f"matmul_{fmt}"
        out.append(Kernel(fam, "row", "rows per thread, token tiles (fastest on CPU adapters)",
                          lambda shape, f=fmt: source(f), prefer="cpu"))  # fmt: skip
        out.append(Kernel(fam, "wg_reduce", "one workgroup per row, shared-memory reduction (for real GPUs)",
                          lambda shape, f=fmt: source(f, "wg_reduce"), prefer="gpu"))  # fmt: skip
    out.append(
        Kernel(
            "matmul_q4_k",
            "mins_added",
            "Q4_K mins added instead of subtracted: negative weights come out positive (001/000)",
            lambda shape: source("q4_k", quant="mins_added"),
            faulty=True,
        )
    )
    return tuple(out)


OP = Op(
    name="matmul",
    what="a linear layer: each output feature is a weighted sum of the input features",
    formula="y[t, n] = Σ_k x[t, k] · W[n, k]  (+ b[n])",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=_kernels(),
    policies=(
        Policy("lm_head", "default", "every row window of the output matmul is dispatched", every_stage=False),
        Policy(
            "lm_head",
            "skip_last_window",
            "the last row window of the output matmul is never dispatched: those logits keep whatever the "
            "buffer held (002)",
            faulty=True,
            window_filter=lambda index, count: index < count - 1,
            every_stage=False,
        ),
    ),
    family=family,
    weight="matrix",
    chunked_output=True,
)
