"""The float64 numpy reference: the stage graph run plainly, each stage by its op module.

Like llm.c's reference beside its fast path: slow, obvious, and the yardstick for
every GPU stage. Weights are dequantized per tensor on first use and cached here
(the reference only — the GPU path never dequantizes a whole model on the host).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from labkit import progress
from labkit.errors import UnknownStageError
from labkit.model.config import ModelConfig
from labkit.model.dequant import dequantize, dequantize_rows
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage
from labkit.ops import OPS


@dataclass
class KVCache:
    """Roped keys and values of the positions already processed, per layer."""

    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def n_past(self) -> int:
        return next(iter(self.k.values())).shape[0] if self.k else 0

    def store(self, kind: str, layer: int, new: np.ndarray) -> None:
        """Append this pass's keys or values of a layer."""
        store = self.k if kind == "k" else self.v
        store[layer] = new if layer not in store else np.concatenate([store[layer], new], axis=0)


@dataclass
class _StageInputs:
    """What an op's `reference` sees (labkit.ops.base.RefInputs)."""

    engine: ReferenceEngine
    x: list[np.ndarray]
    ids: np.ndarray
    positions: np.ndarray
    n_past: int
    layer_cache: dict[str, np.ndarray]

    def weight(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        w = self.engine.weight(name)
        return w if rows is None else w[rows[0] : rows[1]]

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.engine.embed_rows(name, ids)

    def cached(self, kind: str) -> np.ndarray:
        return self.layer_cache[kind]


class ReferenceEngine:
    """Runs a stage graph in float64 numpy, with a KV cache for decode."""

    def __init__(self, gguf: GgufFile, cfg: ModelConfig, graph: list[Stage]):
        self.gguf, self.cfg, self.graph = gguf, cfg, graph
        self._weights: dict[str, np.ndarray] = {}
        self._loading = None  # the bar over the first pass's dequantizations, while it runs
        self._all_loaded = False

    def weight(self, name: str) -> np.ndarray:
        """Dequantized float64 weight, cached on first use."""
        if name not in self._weights:
            t = self.gguf.tensors[name]
            self._weights[name] = dequantize(self.gguf.raw(name), t.ggml_type, t.shape).astype(np.float64)
            if self._loading is not None:
                self._loading.update(1)
        return self._weights[name]

    def _to_dequantize(self) -> list[str]:
        """The weights a pass reads whole (not the embedding's rows) that are not cached yet."""
        if self._all_loaded:
            return []
        used = (n for st in self.graph if OPS[st.op].weight in ("matrix", "vector") for n in (st.weight, st.bias))
        todo = [n for n in dict.fromkeys(used) if n and n not in self._weights]
        self._all_loaded = not todo
        return todo

    def unembed(self, hidden: np.ndarray) -> np.ndarray:
        """Hidden states [n, d_model] → logits [n, vocab]: the final norm, the unembedding (the tied
        embedding when the file has no output.weight) and the final soft-cap, in float64. The logit
        lens reads every layer's residual through this."""
        from labkit.ops.rmsnorm import rmsnorm

        cfg = self.cfg
        E = self.weight("token_embd.weight" if cfg.tied_embeddings else "output.weight")
        h = rmsnorm(np.asarray(hidden, np.float64), self.weight("output_norm.weight"), cfg.rms_eps, cfg.d_model)
        z = h @ E.T
        return cfg.final_softcap * np.tanh(z / cfg.final_softcap) if cfg.final_softcap else z

    def embed_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows of the embedding for `ids` only, unless the whole table is cached (tied heads)."""
        if name in self._weights:
            return self._weights[name][ids]
        t = self.gguf.tensors[name]
        return dequantize_rows(self.gguf.raw(name), t.ggml_type, t.n_cols, ids).astype(np.float64)

    def forward(
        self,
        ids: Iterable[int],
        cache: KVCache | None = None,
        capture: Iterable[str] | None = None,
        each: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run every stage for the new tokens `ids`; returns the captured outputs (all by default).
        `each(output)`, when given, replaces every stage's output before later stages read it (e.g.
        rounding to f16, to see what an engine that keeps its activations in f16 computes)."""
        ids = np.asarray(list(ids), dtype=np.int64)
        cache = cache if cache is not None else KVCache()
        n_past = cache.n_past
        positions = n_past + np.arange(len(ids))
        want = None if capture is None else set(capture)
        unknown = sorted(want - {st.name for st in self.graph}) if want is not None else []
        if unknown:
            raise UnknownStageError(f"names filter has unknown stage(s): {', '.join(unknown)}")
        vals: dict[str, np.ndarray] = {}
        # the first pass dequantizes every weight as its stage comes: a bar over those tensors
        self._loading = progress.bar(len(self._to_dequantize()), "reference: dequantizing weights", "tensor")
        try:
            for st in self.graph:
                layer_cache = {k: (cache.k if k == "k" else cache.v)[st.layer] for k in st.kv_read}
                inputs = _StageInputs(self, [vals[i] for i in st.inputs], ids, positions, n_past, layer_cache)
                vals[st.name] = OPS[st.op].reference(st, inputs)
                if each is not None:
                    vals[st.name] = each(vals[st.name])
                if st.kv_write:
                    cache.store(st.kv_write, st.layer, vals[st.name])
        finally:
            self._loading.close()
            self._loading = None
        return {k: v for k, v in vals.items() if want is None or k in want}
