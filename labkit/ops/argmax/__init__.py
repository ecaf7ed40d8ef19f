"""argmax: the id of each row's largest value, the greedy pick made on the device.

No model's graph has it: a greedy decode step appends it after the logits (`PassRequest.pick`), so
the step reads back one id, 4 bytes, where it read a row of logits (1 MiB of Gemma 3's). Ties go to
the lowest id, as numpy's argmax."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, from_file

PARAMS = Params(n_rows="u32", n="u32")


def reference(stage, ref) -> np.ndarray:
    x = np.asarray(ref.x[0], np.float64)
    return np.argmax(x, axis=-1).astype(np.int32).reshape(-1, 1)


def plan(stage, gpu):
    x = gpu.input(0)
    rows, n = x.shape[0], x.shape[-1]
    out = gpu.output((rows, 1))
    gpu.dispatch([x.buffer, out.buffer], {"n_rows": rows, "n": n}, rows)
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
    kernels=(Kernel("argmax", "default", "the correct kernel, a workgroup a row", from_file("argmax")),),
)
