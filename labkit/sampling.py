"""Token sampling: greedy, or temperature → top-k → softmax → top-p → draw.

Post-mortem 004 is about getting this wrong: its engine cut with top-p on logits before the
softmax and normalized over its top 1000. `default` is the order its team fixed it to, top-p on
probabilities after the softmax, as llama.cpp's own top-p computes them. It is not llama.cpp's
default chain, which cuts (top-k, top-p, min-p) before the temperature and applies the temperature
last (`labkit.lessons.temperature_last`); at T = 1 the two agree. The faulty
orders are the other entries of `SAMPLERS`, the sampler registry (selected as the
`sampling` family, like a kernel variant). `truncate` is the one top-k/top-p: the reference
order, the faulty ones and the GPU sampler (labkit.gpu.sampling) all end in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from labkit.errors import UnknownVariantError

Distribution = tuple[np.ndarray, np.ndarray]  # (candidate ids, probabilities)


def ranked(scores: np.ndarray, k: int = 0) -> np.ndarray:
    """The ids of the k highest of a vector's float scores, highest first and ties by lower id: the
    first k of np.argsort(-scores, kind="stable"), all of it when k <= 0. A top-k takes the k
    through a partition, not a sort of the whole vocabulary (128256 scores: about 20 ms to sort on
    a 2-core AMD EPYC, a few steps' worth of time on a real GPU). Other dtypes are sorted whole
    (negating an unsigned or the lowest signed integer wraps)."""
    scores = np.asarray(scores)
    if scores.ndim != 1:
        raise ValueError(f"ranked() takes a vector of scores, not an array of shape {scores.shape}")
    if k <= 0 or k >= scores.size or scores.dtype.kind != "f":
        return np.argsort(-scores, kind="stable")[: k if k > 0 else None]
    kth = scores[np.argpartition(-scores, k - 1)[:k]].min()  # the k-th highest score
    if not np.isfinite(kth):  # NaN or inf among the best: the sort's own order
        return np.argsort(-scores, kind="stable")[:k]
    above = np.flatnonzero(scores > kth)
    tied = np.flatnonzero(scores == kth)[: k - above.size]  # the lowest ids among the k-th's ties
    ids = np.concatenate([above, tied])
    return ids[np.lexsort((ids, -scores[ids]))]


def _temperature_top_k(logits: np.ndarray, temperature: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(logits, dtype=np.float64) / max(temperature, 1e-8)
    ids = ranked(z, top_k)
    return ids, z[ids]


def _softmax(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max())
    return p / p.sum()


def _top_p(ids: np.ndarray, p: np.ndarray, top_p: float) -> Distribution:
    if top_p >= 1.0:
        return ids, p
    keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
    return ids[:keep], p[:keep] / p[:keep].sum()


def truncate(ids: np.ndarray, p: np.ndarray, top_k: int, top_p: float) -> Distribution:
    """Candidates sorted by falling probability, and their probabilities (any scale): keep the top k,
    renormalize, keep the smallest prefix whose mass reaches top_p, renormalize."""
    if top_k > 0:
        ids, p = ids[:top_k], p[:top_k]
    return _top_p(ids, p / p.sum(), top_p)


def correct_order(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> Distribution:
    """temperature → top-k on logits → softmax → top-p on probabilities (post-mortem 004's fixed order;
    llama.cpp's chain applies the temperature after its cuts)."""
    ids, z = _temperature_top_k(logits, temperature, top_k)
    return truncate(ids, _softmax(z), 0, top_p)


def top_p_before_softmax(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> Distribution:
    """FAULTY (004, bug 2): top-p run on unnormalized exp(logits) before the softmax. The first
    candidate alone already has 'mass' exp(0) = 1 ≥ p, so sampling collapses onto the argmax."""
    ids, z = _temperature_top_k(logits, temperature, top_k)
    if top_p < 1.0:
        mass = np.cumsum(np.exp(z - z.max()))  # the bug: not probabilities
        keep = int(np.searchsorted(mass, top_p) + 1)
        ids, z = ids[:keep], z[:keep]
    return ids, _softmax(z)


def normalized_over_top_1000(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> Distribution:
    """FAULTY (004, bug 1): the softmax denominator summed over the 1000 best tokens only, and
    only those are ever candidates: the tail's probability mass is silently dropped."""
    ids, z = _temperature_top_k(logits, temperature, top_k)
    ids, z = ids[:1000], z[:1000]  # the bug: copy of the first 1000 only
    return _top_p(ids, _softmax(z), top_p)


SamplerFn = Callable[[np.ndarray, float, int, float], Distribution]
SAMPLERS: dict[str, SamplerFn] = {
    "default": correct_order,
    "top_p_before_softmax": top_p_before_softmax,
    "norm_top1000": normalized_over_top_1000,
}
FAULTY_SAMPLERS = ("top_p_before_softmax", "norm_top1000")


def sampler_order(name: str) -> SamplerFn:
    if name not in SAMPLERS:
        raise UnknownVariantError(f"unknown variant {name!r} of sampling; known: {', '.join(SAMPLERS)}")
    return SAMPLERS[name]


@dataclass
class Sampler:
    """temperature 0 means greedy. top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    variant: str = "default"
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        sampler_order(self.variant)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def order(self) -> SamplerFn:
        return sampler_order(self.variant)

    def distribution(self, logits: np.ndarray) -> Distribution:
        """(candidate ids, their probabilities) as this sampler's order computes them."""
        return self.order(logits, self.temperature, self.top_k, self.top_p)

    def draw(self, dist: Distribution) -> int:
        ids, p = dist
        return int(ids[self._rng.choice(len(ids), p=p)])

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        return self.draw(self.distribution(logits))


GREEDY = Sampler()
