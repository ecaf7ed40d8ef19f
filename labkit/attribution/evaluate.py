"""A segment recomputed from an engine's own captured inputs: exactly, or in the engine's precision.

The ops' `reference` functions do the arithmetic (labkit.ops), so "exactly" means the same
float64 code as the reference engine; the inputs are the engine's, not the reference's,
which is what separates a stage's own error from the error it inherits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from labkit.attribution.emulation import Emulation
from labkit.attribution.segments import Segment, kv_writers
from labkit.model.graph import Stage
from labkit.model.weight_cache import WeightCache
from labkit.ops import OPS


@dataclass
class PassContext:
    """What every stage of one pass reads besides its inputs: tokens, positions, and the KV cache
    of the positions before the pass (per layer, from the engine's own earlier pass)."""

    weights: WeightCache
    graph: list[Stage]
    ids: np.ndarray
    n_past: int = 0
    past: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # (layer, "k"/"v") → [n_past, dim]

    def __post_init__(self):
        self.by_name = {st.name: st for st in self.graph}
        self.writers = kv_writers(self.graph)
        self.positions = self.n_past + np.arange(len(self.ids))


@dataclass
class _Inputs:
    """What an op's `reference` sees (labkit.ops.base.RefInputs), in float64 or emulated."""

    ctx: PassContext
    x: list[np.ndarray]
    layer_cache: dict[str, np.ndarray]
    emulation: Emulation | None

    @property
    def ids(self) -> np.ndarray:
        return self.ctx.ids

    @property
    def positions(self) -> np.ndarray:
        return self.ctx.positions

    @property
    def n_past(self) -> int:
        return self.ctx.n_past

    @property
    def angle_dtype(self):
        """Rope's angles: exact, or in f32 as every engine emulated here computes them."""
        return np.float64 if self.emulation is None or self.emulation.precision == "float64" else np.float32

    def weight(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        w = self.ctx.weights.get(name)
        w = w if rows is None else w[rows[0] : rows[1]]
        return w if self.emulation is None else self.emulation.weights(w)

    def matmul(self, x: np.ndarray, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        if self.emulation is None:
            return self.ctx.weights.matmul(x, name, rows)
        t = self.ctx.weights.gguf.tensors[name]
        return self.ctx.weights.matmul(x, name, rows, product=self.emulation.product(t.ggml_type, t.n_cols))

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        w = self.ctx.weights.rows(name, ids).astype(np.float64)
        return w if self.emulation is None else self.emulation.weights(w)

    def cached(self, kind: str) -> np.ndarray:
        return self.layer_cache[kind]


def evaluate(
    segment: Segment, captured: Mapping[str, np.ndarray], ctx: PassContext, emulation: Emulation | None = None
) -> np.ndarray:
    """The segment's last stage, computed from the captured inputs (float64, or as `emulation`)."""
    store = (lambda a: np.asarray(a, np.float64)) if emulation is None else emulation.storage
    vals = {name: store(captured[name]) for name in segment.inputs}
    for name in segment.stages:
        st = ctx.by_name[name]
        xs = [vals[n] for n in st.inputs]
        xs = xs if emulation is None else emulation.inputs(st, xs)
        cache = {kind: _cache(ctx, vals, st.layer, kind, emulation) for kind in st.kv_read}
        vals[name] = store(OPS[st.op].reference(st, _Inputs(ctx, xs, cache, emulation)))
    return np.asarray(vals[segment.stage], np.float64)


def _cache(ctx: PassContext, vals: dict, layer: int, kind: str, emulation: Emulation | None) -> np.ndarray:
    """A layer's cache as the stage reads it: the positions before the pass, then this pass's."""
    now = vals[ctx.writers[(layer, kind)]]
    past = ctx.past.get((layer, kind))
    full = now if past is None else np.concatenate([np.asarray(past, now.dtype), now], axis=0)
    return full if emulation is None else emulation.kv(full)
