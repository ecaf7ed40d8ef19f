"""head_matmul: each head's slice of the row times that head's own matrix, ggml's mul_mat with a 3-D
weight (DeepSeek's attn_k_b and attn_v_b: [heads, out, in]).

The absorbed latent attention takes each head's unrotated query into the latent's space through its
slice of attn_k_b (`q_absorbed`), and each head's latent context back out through its slice of attn_v_b
(`attn_ctx`). On the GPU this is the mixture-of-experts matmul with every head its own expert: slot h
of a token reads head h's rows, so the 26 formats' readers and both drivers serve it unchanged."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from labkit.ops import moe_matmul
from labkit.ops.base import Op


def reference(stage, ref) -> np.ndarray:
    P = stage.params
    H, N = P["heads"], P["out"]
    x = ref.x[0].reshape(ref.x[0].shape[0], H, P["in"])
    cols = [ref.matmul(np.ascontiguousarray(x[:, h]), stage.weight, (h * N, (h + 1) * N)) for h in range(H)]
    return np.concatenate(cols, axis=-1)


def plan(stage, gpu):
    P = stage.params
    T, H = gpu.T, P["heads"]
    out = gpu.output((T, H * P["out"]))
    moe_matmul.dispatch(stage, gpu, gpu.input(0), gpu.head_ids(H), replace(out, shape=(T, H, P["out"])), per_slot=True)
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    H = P["heads"]
    return [f"[T, {H}·{P['in']}]", f"{stage.weight} [{H}, {P['out']}, {P['in']}]"], f"[T, {H}·{P['out']}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["heads"] * st.params["out"]),
    name="head_matmul",
    what="multiplies each head's slice of the row by that head's own matrix",
    formula="y[t, h, n] = Σ_c x[t, h, c] · W[h, n, c]",
    params=moe_matmul.PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    family=moe_matmul.family,
    weight="experts",
)
