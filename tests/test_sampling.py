"""The sampler's ranking: a top-k through a partition is the full stable sort's first k."""

import numpy as np
import pytest

import labkit
from labkit.sampling import correct_order, ranked


def stable_first(scores: np.ndarray, k: int) -> np.ndarray:
    """What ranked() must equal: numpy's stable sort of the negated scores, cut to k."""
    order = np.argsort(-scores, kind="stable")
    return order if k <= 0 else order[:k]


@pytest.mark.parametrize("seed", range(6))
def test_ranked_is_the_stable_sorts_first_k_with_ties_and_odd_k(seed):
    """Random scores with many ties (few distinct values, so the k-th score is usually tied across
    the cut), at k from 1 to past the end, equal the stable sort's first k, id for id."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    scores = rng.integers(0, 7, n).astype(np.float64) + (rng.random(n) < 0.5) * rng.random(n)
    for k in (0, 1, 2, 3, 17, 40, n // 2, n - 1, n, n + 5):
        got, want = ranked(scores, k), stable_first(scores, k)
        assert got.tolist() == want.tolist(), f"n={n} k={k}: first difference at {np.argmax(got != want)}"


def test_ranked_matches_with_infinities_and_nan():
    """Masked logits (-inf), a +inf, a NaN: the sort's order, whether they reach the top k or not."""
    rng = np.random.default_rng(7)
    scores = rng.standard_normal(500)
    scores[rng.choice(500, 60, replace=False)] = -np.inf
    for k in (5, 439, 440, 441, 499):
        assert ranked(scores, k).tolist() == stable_first(scores, k).tolist(), k
    scores[[3, 90]] = np.inf
    scores[200] = np.nan
    for k in (1, 2, 3, 40, 498):
        assert ranked(scores, k).tolist() == stable_first(scores, k).tolist(), k


def test_the_samplers_distribution_is_the_full_sorts(tiny_model):
    """The correct order's candidates and probabilities at a 128256-token vocabulary (Llama 3's) and
    a top-k equal those the full sort gives; so does the GPU sampler's."""
    from labkit.gpu.sampling import GpuSampler

    rng = np.random.default_rng(3)
    logits = np.round(rng.standard_normal(128256) * 4, 1)  # rounded: ties across the top-k cut
    z = logits / 0.8
    for top_k, top_p in ((40, 0.95), (1, 1.0), (1000, 0.5)):
        ids, p = correct_order(logits, 0.8, top_k, top_p)
        want = stable_first(z, top_k)
        w = np.exp(z[want] - z[want].max())
        w /= w.sum()
        keep = int(np.searchsorted(np.cumsum(w), top_p) + 1) if top_p < 1.0 else top_k
        assert ids.tolist() == want[:keep].tolist(), (top_k, top_p)
        assert np.allclose(p, w[:keep] / w[:keep].sum(), rtol=1e-12), (top_k, top_p)
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    small = logits[: lab.config.vocab_size]
    s = labkit.Sampler(0.8, 5, 0.95, 1)
    gpu_ids, _ = GpuSampler(lab.executor, s).distribution(small)
    assert gpu_ids.tolist() == s.distribution(small)[0].tolist()
