"""softmax: each row of attention scores turned into probabilities that sum to 1.

The max is subtracted first so exp never overflows; skipping that is fault `no_max_sub`
(post-mortem 003). Masked (-inf) scores become exact zeros. gpt-oss gives each head a sink: a
learned logit that enters the max and the denominator but owns no key, so a head can attend to
nothing (its row then sums to less than 1)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose, wgsl_const, wgsl_file

PARAMS = Params(n_rows="u32", n="u32", rows_per_head="u32", sinks="u32")


def softmax(s: np.ndarray) -> np.ndarray:
    """Row softmax; a fully masked row (all -inf) gives zeros, as the kernel does, not 0/0. A row
    holding a NaN stays NaN, as in any engine: the reference must not hide a NaN it is given."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=(total > 0) | np.isnan(total))


def with_sinks(s: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """Softmax of [heads, T, S] scores with a sink logit per head: a column that takes its share
    of the denominator, then is dropped."""
    H, T, _ = s.shape
    col = np.broadcast_to(np.asarray(sinks, np.float64).reshape(H, 1, 1), (H, T, 1))
    return softmax(np.concatenate([s, col], axis=-1))[..., :-1]


def reference(stage, ref) -> np.ndarray:
    sinks = stage.params.get("sinks")
    return with_sinks(ref.x[0], ref.weight(sinks)) if sinks else softmax(ref.x[0])


def workgroups(n_rows: int, source: str | None = None) -> int:
    """ROWS_PER_WG rows a workgroup, as the kernel's source declares (softmax.wgsl: 8 threads a row,
    64 a workgroup); a user's kernel without the constant gets a workgroup a row."""
    return ceil_div(n_rows, wgsl_const(source or wgsl_file("softmax"), "ROWS_PER_WG", 1))


def _with_shift(part: str):
    """The kernel: softmax.wgsl after its shift part (the stable one, or a fault's) and the lane sums."""
    return lambda shape: compose("lanes8", part, "softmax")


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    n, sinks = x.shape[-1], stage.params.get("sinks")
    n_rows = x.size // n
    sink_buffer = gpu.vector(sinks) if sinks else x.buffer  # bound, unread, without sinks
    values = {"n_rows": n_rows, "n": n, "rows_per_head": n_rows // stage.params["n_heads"], "sinks": int(bool(sinks))}
    gpu.dispatch([x.buffer, out.buffer, sink_buffer], values, workgroups(n_rows, gpu.kernel.source(gpu.shape)))
    return out


def shapes(stage) -> tuple[list[str], str]:
    d = f"[{stage.params['n_heads']}, T, S]"
    sinks = stage.params.get("sinks")
    return [d, *([f"{sinks} [{stage.params['n_heads']}]"] if sinks else [])], d


SINK_FORMULA = "p[s] = exp(x[s] − m) / (Σ exp(x − m) + exp(sink − m)),  m = max(max x, sink)  (a sink per head)"

OP = Op(
    layout="heads",  # output: its input's shape, [heads, queries, keys]
    name="softmax",
    what="turns each query's scores into probabilities over the keys",
    formula="p[s] = exp(x[s] − max x) / Σ exp(x − max x)",
    formula_of=lambda st: SINK_FORMULA if st.params.get("sinks") else OP.formula,
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        Kernel("softmax", "default", "the correct kernel", _with_shift("softmax_stable")),
        Kernel(
            "softmax",
            "no_max_sub",
            "no max-subtraction: exp overflows to inf, inf/inf = NaN (003)",
            _with_shift("softmax_no_max_sub"),
            faulty=True,
        ),
        Kernel(
            "softmax",
            "masked_nan",
            "a fully masked row gives NaN instead of zeros (003)",
            _with_shift("softmax_masked_nan"),
            faulty=True,
        ),
    ),
    step_fields=("n",),  # a decode step's scores are one key longer
)
