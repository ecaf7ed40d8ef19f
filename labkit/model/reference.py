"""The float64 numpy reference: the stage graph run plainly, each stage by its op module.

Like llm.c's reference beside its fast path: slow, obvious, and the yardstick for
every GPU stage. It streams: a weight is dequantized from the memory-mapped file when a
stage needs it and kept in a cache under the memory budget (labkit.model.weight_cache: the
weights a pass reads first stay for the next), and a stage's output is dropped after its
last reader unless it is captured (labkit.model.liveness). So the models people debug (1B to 8B) fit,
and a small model's weights all stay, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from labkit import progress
from labkit.errors import UnknownStageError
from labkit.model.batch_stages import output_layout, per_sequence
from labkit.model.config import ModelConfig
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage
from labkit.model.liveness import last_readers
from labkit.model.memory import weights_read_whole
from labkit.model.weight_cache import WeightCache, shared_cache
from labkit.ops import OPS


@dataclass
class KVCache:
    """What a sequence keeps between passes: roped keys and values of the positions already
    processed, per attending layer, and each recurrent layer's states ((kind, layer) -> array:
    "conv", "scan"), which stay one size however long the sequence grows."""

    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)
    states: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    n_past: int = 0  # positions processed (advanced by each pass)

    def store(self, kind: str, layer: int, new: np.ndarray) -> None:
        """Append this pass's keys or values of a layer."""
        store = self.k if kind == "k" else self.v
        store[layer] = new if layer not in store else np.concatenate([store[layer], new], axis=0)

    def state(self, kind: str, layer: int, shape: tuple[int, ...]) -> np.ndarray:
        """A layer's state as the last pass left it; zeros before the sequence's first pass."""
        held = self.states.get((kind, layer))
        return np.zeros(shape) if held is None else held.reshape(shape)


@dataclass
class _Segment:
    """The rows [start, end) of a pass's packed tokens that one sequence owns, and its cache."""

    start: int
    end: int
    cache: KVCache
    ids: np.ndarray
    positions: np.ndarray


def _packed(segments: list[_Segment]) -> _Segment:
    """Every sequence's rows as one segment, for a stage that treats each token alone. It has no
    cache of its own: such a stage neither reads nor writes one."""
    return _Segment(0, segments[-1].end, KVCache(), np.concatenate([s.ids for s in segments]),
                    np.concatenate([s.positions for s in segments]))  # fmt: skip


def _part(value: np.ndarray | list[np.ndarray], k: int, seg: _Segment) -> np.ndarray:
    """Sequence k's part of a stage's output: its own array, or its rows of the packed one."""
    return value[k] if isinstance(value, list) else value[seg.start : seg.end]


def _nbytes(value: np.ndarray | list[np.ndarray]) -> int:
    return sum(a.nbytes for a in value) if isinstance(value, list) else value.nbytes


@dataclass
class _StageInputs:
    """What an op's `reference` sees (labkit.ops.base.RefInputs)."""

    engine: ReferenceEngine
    x: list[np.ndarray]
    ids: np.ndarray
    positions: np.ndarray
    n_past: int
    layer_cache: dict[str, np.ndarray]
    layer: int | None = None
    cache: KVCache | None = None

    def state(self, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        """This layer's recurrent state of `kind` as the sequence's last pass left it."""
        return self.cache.state(kind, self.layer, shape)

    def set_state(self, kind: str, value: np.ndarray) -> None:
        """The state this pass leaves for the next (the op that advances it sets it)."""
        self.cache.states[(kind, self.layer)] = np.asarray(value, np.float64)

    def weight(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        w = self.engine.weight(name)
        return w if rows is None else w[rows[0] : rows[1]]

    def matmul(self, x: np.ndarray, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """x @ W[rows].T in float64, W held or streamed in row chunks (labkit.model.weight_cache)."""
        return self.engine.weights.matmul(x, name, rows)

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.engine.embed_rows(name, ids)

    def cached(self, kind: str) -> np.ndarray:
        return self.layer_cache[kind]

    @property
    def forced_ids(self) -> dict[int, np.ndarray] | None:
        """Teacher-forced routing: {layer: the experts each token goes to} (labkit.ops.moe_router)."""
        return self.engine.forced_ids


class ReferenceEngine:
    """Runs a stage graph in float64 numpy, with a KV cache for decode."""

    def __init__(self, gguf: GgufFile, cfg: ModelConfig, graph: list[Stage], weights: WeightCache | None = None):
        self.gguf, self.cfg, self.graph = gguf, cfg, graph
        self.weights = weights if weights is not None else shared_cache(gguf)
        self._last_reader = last_readers(graph)
        self._per_sequence = per_sequence(graph)
        self.peak_live_bytes = 0  # the last pass's most bytes of uncaptured outputs alive at once
        self.forced_ids: dict[int, np.ndarray] | None = None  # a mixture's routing taken from another run

    def weight(self, name: str) -> np.ndarray:
        """A dequantized weight (float32 or float64, exact either way), held when the cache has room."""
        return self.weights.get(name)

    def unembed(self, hidden: np.ndarray) -> np.ndarray:
        """Hidden states [n, d_model] → logits [n, vocab]: the final norm, the unembedding (the tied
        embedding when the file has no output.weight) and the final soft-cap, in float64. The logit
        lens reads every layer's residual through this."""
        from labkit.ops.rmsnorm import rmsnorm

        cfg = self.cfg
        E = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
        h = rmsnorm(np.asarray(hidden, np.float64), self.weight("output_norm.weight"), cfg.rms_eps, cfg.d_model)
        z = self.weights.matmul(h, E)
        return cfg.final_softcap * np.tanh(z / cfg.final_softcap) if cfg.final_softcap else z

    def embed_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows of the embedding for `ids` only, unless the whole table is held (tied heads)."""
        return self.weights.rows(name, ids).astype(np.float64)

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
        cache = cache if cache is not None else KVCache()
        return self.forward_batch([ids], [cache], capture, each)[0]

    def forward_batch(
        self,
        seqs: list[Iterable[int]],
        caches: list[KVCache],
        capture: Iterable[str] | None = None,
        each: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """One pass of several sequences' new tokens, packed on one token axis as engines batch them:
        each sequence continues its own cache, the stages that mix a sequence's tokens run once per
        sequence (labkit.model.batch_stages), the others once over the packed rows. Returns each
        sequence's captures, as its own pass would."""
        segments, start = [], 0
        for ids, cache in zip(seqs, caches, strict=True):
            ids = np.asarray(list(ids), dtype=np.int64)
            segments.append(_Segment(start, start + len(ids), cache, ids, cache.n_past + np.arange(len(ids))))
            start += len(ids)
        want = None if capture is None else set(capture)
        unknown = sorted(want - {st.name for st in self.graph}) if want is not None else []
        if unknown:
            raise UnknownStageError(f"names filter has unknown stage(s): {', '.join(unknown)}")
        self.weights.begin_pass()  # a full cache evicts for this pass only what neither it nor the last one read
        todo = self._to_dequantize()
        with progress.bar(len(todo), "reference: dequantizing weights", "tensor") as bar:
            self.weights.on_load = lambda name: bar.update(name in todo)
            try:
                kept = self._forward(segments, want, each)
            finally:
                self.weights.on_load = None
        for seg in segments:
            seg.cache.n_past += seg.end - seg.start
        if len(segments) == 1:
            return [kept]
        return [{n: _part(v, k, seg) for n, v in kept.items()} for k, seg in enumerate(segments)]

    def _forward(self, segments: list[_Segment], want, each) -> dict[str, np.ndarray | list[np.ndarray]]:
        """forward's loop over the stages, freeing each output after its last reader."""
        vals: dict[str, np.ndarray | list[np.ndarray]] = {}
        kept: dict[str, np.ndarray | list[np.ndarray]] = {}
        live = self.peak_live_bytes = 0
        for i, st in enumerate(self.graph):
            if len(segments) == 1:
                vals[st.name] = self._stage(st, [vals[n] for n in st.inputs], segments[0], each)
            elif st.name in self._per_sequence:
                outs = [self._stage(st, [_part(vals[n], k, seg) for n in st.inputs], seg, each)
                        for k, seg in enumerate(segments)]  # fmt: skip
                vals[st.name] = np.concatenate(outs, axis=0) if output_layout(st) in ("rows", "ids") else outs
            else:
                vals[st.name] = self._stage(st, [vals[n] for n in st.inputs], _packed(segments), each)
            if want is None or st.name in want:
                kept[st.name] = vals[st.name]
            else:
                live += _nbytes(vals[st.name])
            self.peak_live_bytes = max(self.peak_live_bytes, live)
            for n in dict.fromkeys([*st.inputs, st.name]):  # free what no later stage reads (kept captures stay)
                if self._last_reader[n] <= i and n in vals:
                    gone = vals.pop(n)
                    live -= 0 if n in kept else _nbytes(gone)
        return kept

    def _stage(self, st: Stage, xs: list[np.ndarray], seg: _Segment, each) -> np.ndarray:
        """One stage on one segment's rows (a sequence's, or the packed batch's), its cache written."""
        cache = seg.cache
        layer_cache = {k: (cache.k if k == "k" else cache.v)[st.layer] for k in st.kv_read}
        inputs = _StageInputs(self, xs, seg.ids, seg.positions, cache.n_past, layer_cache, st.layer, cache)
        out = OPS[st.op].reference(st, inputs)
        out = out if each is None else each(out)
        if st.kv_write:
            cache.store(st.kv_write, st.layer, out)
        return out

    def _to_dequantize(self) -> set[str]:
        """The weights a pass reads whole (not the embedding's rows) that are not held: its first
        pass's, or, under a tight budget, those evicted or streamed. A bar counts them."""
        return {n for n in weights_read_whole(self.graph) if n not in self.weights}
