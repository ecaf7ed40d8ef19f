"""columns: groups of columns taken out of each row: Qwen3.5's queries out of q_full.

Qwen3.5's gated attention projects each head's query and its output gate side by side
(attn_q's rows: head 0's query, head 0's gate, head 1's query, ...); llama.cpp views the
queries out (`Qcur_reshaped`), and its q norm reads that view. Here the view is a stage:
group g of a row is X[offset + g·step : ... + width]. DeepSeek's latent attention takes a token's
latent and rotary key out of one projection, and each head's query parts, the same way; and copies
the latent into the V cache (the output then a cache row at the pass's first position)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose

PARAMS = Params(n="u32", width="u32", groups="u32", stride="u32", step="u32", offset="u32", x_offset="u32",
                y_offset="u32")  # fmt: skip


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    x = ref.x[0]
    starts = P["offset"] + P["step"] * np.arange(P["groups"])
    idx = (starts[:, None] + np.arange(P["width"])[None, :]).ravel()
    return x[:, idx]


def plan(stage, gpu):
    P = stage.params
    x = gpu.input(0)
    out = gpu.output((gpu.T, P["groups"] * P["width"]))
    values = {"n": out.size, "width": P["width"], "groups": P["groups"], "stride": x.shape[-1], "step": P["step"],
              "offset": P["offset"], "x_offset": x.offset, "y_offset": out.offset}  # fmt: skip
    gpu.dispatch([x.buffer, out.buffer], values, ceil_div(out.size, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"[T, {P['in']}]"], f"[T, {P['groups'] * P['width']}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["groups"] * st.params["width"]),
    name="columns",
    what="takes each head's query out of a projection that interleaves queries and gates",
    formula="y[t, g·w + i] = x[t, offset + g·step + i]",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    step_fields=("y_offset",),  # a KV writer's (DeepSeek's K and V cache rows) position in the cache
    kernels=(
        Kernel("columns", "default", "the correct kernel", lambda _: compose("columns", "columns_start")),
        Kernel(
            "columns",
            "rotary_first",
            "every group read from the start of its slot, the offset ignored: MLA's [nope | rope] rows read as if "
            "the rotary values came first, so the rotary key is taken out of the latent (ml-explore/mlx-lm#512: "
            "DeepSeek-V3.2's indexer keeps [rope | nope] where its attention keeps [nope | rope]; "
            "raullenchai/Rapid-MLX#1225: a patch scaled the wrong slice of a [nope | rope] head)",
            lambda _: compose("columns", "columns_rotary_first"),
            faulty=True,
        ),
    ),
)
