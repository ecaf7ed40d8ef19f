"""concat: two rows joined group by group, as ggml_concat along dim 0 joins them.

DeepSeek's absorbed attention scores a query against the cached key as one dot product: each head's
query is its absorbed unrotated part (kv_lora values) then its rotated part (rope values), and the
key is the normed latent then the rotary key. llama.cpp concatenates them (`Qcur`, `Kcur`); here each
is a stage, so the cache row and the query the scores read are captured as they are."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, from_file

PARAMS = Params(n="u32", groups="u32", wa="u32", wb="u32", a_offset="u32", b_offset="u32", y_offset="u32")


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    (wa, wb), g = P["widths"], P["groups"]
    a, b = ref.x[0].reshape(-1, g, wa), ref.x[1].reshape(-1, g, wb)
    return np.concatenate([a, b], axis=-1).reshape(a.shape[0], g * (wa + wb))


def plan(stage, gpu):
    P = stage.params
    (wa, wb), g = P["widths"], P["groups"]
    a, b = gpu.input(0), gpu.input(1)
    out = gpu.output((gpu.T, g * (wa + wb)))
    values = {"n": out.size, "groups": g, "wa": wa, "wb": wb, "a_offset": a.offset, "b_offset": b.offset,
              "y_offset": out.offset}  # fmt: skip
    gpu.dispatch([a.buffer, b.buffer, out.buffer], values, ceil_div(out.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    (wa, wb), g = stage.params["widths"], stage.params["groups"]
    return [f"[T, {g}·{wa}]", f"[T, {g}·{wb}]"], f"[T, {g}·{wa + wb}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["groups"] * sum(st.params["widths"])),
    name="concat",
    what="joins two rows group by group: each head's absorbed query and its rotated part, or a token's latent and "
    "its rotary key",
    formula="y[t, g, :] = [a[t, g, :], b[t, g, :]]",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    step_fields=("y_offset",),  # a KV writer's (DeepSeek's K and V cache rows) position in the cache
    kernels=(Kernel("concat", "default", "the correct kernel", from_file("concat")),),
)
