"""argmax: the id of each row's largest value, the greedy pick made on the device.

No model's graph has it: a greedy decode step appends it after the logits (`PassRequest.pick`), so
the step reads back one id, 4 bytes, where it read a row of logits (1 MiB of Gemma 3's). Ties go to
the lowest id, as numpy's argmax."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n_rows="u32", n="u32", parts="u32", phase="u32")
SLICE = 4096  # values a workgroup of the first dispatch takes at most


def reference(stage, ref) -> np.ndarray:
    x = np.asarray(ref.x[0], np.float64)
    return np.argmax(x, axis=-1).astype(np.int32).reshape(-1, 1)


def plan(stage, gpu):
    x = gpu.input(0)
    rows, n = x.shape[0], x.shape[-1]
    out = gpu.output((rows, 1))
    parts = ceil_div(n, SLICE)
    pairs = gpu.temp((rows, 2 * parts), "pairs")
    values = {"n_rows": rows, "n": n, "parts": parts}
    gpu.dispatch([x.buffer, pairs.buffer, out.buffer], values | {"phase": 0}, rows * parts)
    gpu.dispatch([x.buffer, pairs.buffer, out.buffer], values | {"phase": 1}, rows)
    return out


def shapes(stage) -> tuple[list[str], str]:
    return ["[T, vocab]"], "[T, 1] ids"


OP = Op(
    output=lambda st, s: (s.T, 1),
    name="argmax",
    what="picks the id of each row's largest value: greedy decoding's next token, on the device",
    formula="y[t] = argmax_i x[t, i]  (ties: the lowest i)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    layout="ids",
    kernels=(Kernel("argmax", "default", "the correct kernel: slices of a row, then their best", from_file("argmax")),),
)
