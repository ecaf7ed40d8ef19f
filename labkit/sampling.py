"""Token sampling: greedy, or temperature → top-k → softmax → top-p → draw (llama.cpp's order).

Post-mortem 004 is about getting this order wrong; the faulty orders live in the
variant registry, this module is the correct one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    """temperature 0 means greedy. top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(candidate ids, their probabilities) after temperature, top-k, softmax and top-p."""
        z = np.asarray(logits, dtype=np.float64) / max(self.temperature, 1e-8)
        ids = np.argsort(-z, kind="stable")
        if self.top_k > 0:
            ids = ids[: self.top_k]
        zs = z[ids]
        p = np.exp(zs - zs.max())
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            ids, p = ids[:keep], p[:keep]
            p = p / p.sum()
        return ids, p

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        ids, p = self.distribution(logits)
        return int(ids[self._rng.choice(len(ids), p=p)])


GREEDY = Sampler()
