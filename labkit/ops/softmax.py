"""softmax: each row of attention scores turned into probabilities that sum to 1.

The max is subtracted first so exp never overflows; skipping that is fault `no_max_sub`
(post-mortem 003). Masked (-inf) scores become exact zeros."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, from_file

PARAMS = Params(n_rows="u32", n="u32")


def softmax(s: np.ndarray) -> np.ndarray:
    """Row softmax; a fully masked row (all -inf) gives zeros, as the kernel does, not 0/0. A row
    holding a NaN stays NaN, as in any engine: the reference must not hide a NaN it is given."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=(total > 0) | np.isnan(total))


def reference(stage, ref) -> np.ndarray:
    return softmax(ref.x[0])


def workgroups(n_rows: int) -> int:
    """One workgroup of 64 threads per row."""
    return n_rows


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    n = x.shape[-1]
    gpu.dispatch([x.buffer, out.buffer], {"n_rows": x.size // n, "n": n}, workgroups(x.size // n))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[{stage.params['n_heads']}, T, S]"
    return [d], d


ROLES = {
    "attn_probs": (
        "the attention pattern: each query's scores turned into probabilities over the visible keys (each"
        " row sums to 1; masked keys get 0)"
    ),
}

OP = Op(
    layout="heads",  # output: its input's shape, [heads, queries, keys]
    roles=ROLES,
    name="softmax",
    what="turns each query's scores into probabilities over the keys",
    formula="p[s] = exp(x[s] − max x) / Σ exp(x − max x)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel("softmax", "default", "the correct kernel", from_file("softmax")),
        Kernel(
            "softmax",
            "no_max_sub",
            "no max-subtraction: exp overflows to inf, inf/inf = NaN (003)",
            from_file("softmax_no_max_sub"),
            faulty=True,
        ),
        Kernel(
            "softmax",
            "masked_nan",
            "a fully masked row gives NaN instead of zeros (003)",
            from_file("softmax_masked_nan"),
            faulty=True,
        ),
    ),
)
