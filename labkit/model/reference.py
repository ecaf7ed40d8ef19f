"""The float64 numpy reference: the stage graph run plainly, one op per function.

Like llm.c's reference beside its fast path: slow, obvious, and the yardstick for
every GPU stage. Weights are dequantized per tensor on first use and cached here
(the reference only — the GPU path never dequantizes a whole model on the host).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from labkit.errors import UnknownStageError, UnsupportedArchitectureError
from labkit.model.config import ModelConfig
from labkit.model.dequant import dequantize, dequantize_rows
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage


@dataclass
class KVCache:
    """Roped keys and values of the positions already processed, per layer."""

    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def n_past(self) -> int:
        return next(iter(self.k.values())).shape[0] if self.k else 0


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, group: int) -> np.ndarray:
    shape = x.shape
    g = x.reshape(-1, group)
    out = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps) * w
    return out.reshape(shape)


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    n_heads: int,
    head_dim: int,
    rope_dim: int,
    base: float,
    style: str,
) -> np.ndarray:
    """Rotate pairs by pos·base^(-2i/rope_dim): neox pairs (i, i+d/2), normal pairs (2i, 2i+1)."""
    T = x.shape[0]
    h = x.reshape(T, n_heads, head_dim).copy()
    half = rope_dim // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if style == "neox":
        a, b = h[..., :half].copy(), h[..., half:rope_dim].copy()
        h[..., :half] = a * cos - b * sin
        h[..., half:rope_dim] = a * sin + b * cos
    elif style == "normal":
        a, b = h[..., 0:rope_dim:2].copy(), h[..., 1:rope_dim:2].copy()
        h[..., 0:rope_dim:2] = a * cos - b * sin
        h[..., 1:rope_dim:2] = a * sin + b * cos
    else:
        raise UnsupportedArchitectureError(f"unknown rope style {style!r}")
    return h.reshape(T, n_heads * head_dim)


def attn_scores(
    q: np.ndarray,
    k_all: np.ndarray,
    n_past: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    scale: float,
    window: int | None,
) -> np.ndarray:
    """[heads, T, n_past+T] scaled q·k with the causal (and sliding-window) mask as -inf."""
    T, S = q.shape[0], k_all.shape[0]
    qh = q.reshape(T, n_heads, head_dim).transpose(1, 0, 2)
    kh = k_all.reshape(S, n_kv_heads, head_dim).transpose(1, 0, 2)
    kh = np.repeat(kh, n_heads // n_kv_heads, axis=0)
    s = np.einsum("htd,hsd->hts", qh, kh) * scale
    return np.where(attention_mask(T, n_past, window)[None], s, -np.inf)


def attention_mask(T: int, n_past: int, window: int | None) -> np.ndarray:
    """True where query t (at position n_past+t) may see key position s (llama.cpp's rule)."""
    qpos = n_past + np.arange(T)[:, None]
    kpos = np.arange(n_past + T)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= (qpos - kpos) < window
    return allowed


def softmax(s: np.ndarray) -> np.ndarray:
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def attn_ctx(p: np.ndarray, v_all: np.ndarray, n_heads: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    H, T, S = p.shape
    vh = v_all.reshape(S, n_kv_heads, head_dim).transpose(1, 0, 2)
    vh = np.repeat(vh, n_heads // n_kv_heads, axis=0)
    return np.einsum("hts,hsd->thd", p, vh).reshape(T, n_heads * head_dim)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"gelu_tanh": gelu_tanh, "silu": silu}


class ReferenceEngine:
    """Runs a stage graph in float64 numpy, with a KV cache for decode."""

    def __init__(self, gguf: GgufFile, cfg: ModelConfig, graph: list[Stage]):
        self.gguf, self.cfg, self.graph = gguf, cfg, graph
        self._weights: dict[str, np.ndarray] = {}

    def weight(self, name: str) -> np.ndarray:
        """Dequantized float64 weight, cached on first use."""
        if name not in self._weights:
            t = self.gguf.tensors[name]
            self._weights[name] = dequantize(self.gguf.raw(name), t.ggml_type, t.shape).astype(np.float64)
        return self._weights[name]

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        name = "token_embd.weight"
        if name in self._weights:
            return self._weights[name][ids]
        t = self.gguf.tensors[name]
        return dequantize_rows(self.gguf.raw(name), t.ggml_type, t.n_cols, ids).astype(np.float64)

    def forward(
        self, ids: Iterable[int], cache: KVCache | None = None, capture: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run every stage for the new tokens `ids`; returns the captured outputs (all by default)."""
        ids = np.asarray(list(ids), dtype=np.int64)
        cache = cache if cache is not None else KVCache()
        n_past = cache.n_past
        positions = n_past + np.arange(len(ids))
        want = None if capture is None else set(capture)
        unknown = sorted(want - {st.name for st in self.graph}) if want is not None else []
        if unknown:
            raise UnknownStageError(f"names filter has unknown stage(s): {', '.join(unknown)}")
        vals: dict[str, np.ndarray] = {}
        for st in self.graph:
            vals[st.name] = self._run_stage(st, vals, ids, positions, cache, n_past)
        return {k: v for k, v in vals.items() if want is None or k in want}

    def _run_stage(
        self,
        st: Stage,
        vals: dict[str, np.ndarray],
        ids: np.ndarray,
        positions: np.ndarray,
        cache: KVCache,
        n_past: int,
    ) -> np.ndarray:
        P = st.params
        x = [vals[i] for i in st.inputs]
        if st.op == "embed":
            return self.embed_rows(ids) * P["scale"]
        if st.op == "rmsnorm":
            return rmsnorm(x[0], self.weight(st.weight), P["eps"], P["group"])
        if st.op == "matmul":
            y = x[0] @ self.weight(st.weight).T
            return y + self.weight(st.bias) if st.bias else y
        if st.op == "rope":
            return rope(x[0], positions, P["n_heads"], P["head_dim"], P["rope_dim"], P["base"], P["style"])
        if st.op == "attn_scores":
            k_all = _append(cache.k, st.layer, x[1])
            return attn_scores(
                x[0],
                k_all,
                n_past,
                P["n_heads"],
                P["n_kv_heads"],
                P["head_dim"],
                P["scale"],
                P["window"],
            )
        if st.op == "softmax":
            return softmax(x[0])
        if st.op == "attn_ctx":
            v_all = _append(cache.v, st.layer, x[1])
            return attn_ctx(x[0], v_all, P["n_heads"], P["n_kv_heads"], P["head_dim"])
        if st.op == "add":
            return x[0] + x[1]
        if st.op == "glu":
            return ACTIVATIONS[P["act"]](x[0]) * x[1]
        raise UnknownStageError(f"reference has no op {st.op!r}")


def _append(store: dict[int, np.ndarray], layer: int, new: np.ndarray) -> np.ndarray:
    store[layer] = new if layer not in store else np.concatenate([store[layer], new], axis=0)
    return store[layer]
