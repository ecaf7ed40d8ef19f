"""The sampler's ranking: a top-k through a partition is the full stable sort's first k."""

import numpy as np
import pytest

import labkit
from labkit.sampling import correct_order, ranked


def stable_first(scores: np.ndarray, k: int) -> np.ndarray:
    """What ranked() must equal: numpy's stable sort of the negated scores, cut to k."""
    order = np.argsort(-scores, kind="stable")
    return order if k <= 0 else order[:k]


def check(scores: np.ndarray, ks) -> None:
    for k in ks:
        got, want = ranked(scores, k), stable_first(scores, k)
        assert got.tolist() == want.tolist(), f"n={scores.size} k={k}: {got[:8]} against {want[:8]}"


@pytest.mark.parametrize("seed", range(6))
def test_ranked_is_the_stable_sorts_first_k(seed):
    """Random scores, continuous and from a few values (every cut then falls inside a run of ties,
    whose lowest ids the sort keeps), at k from 1 to one short of the end (the partition's path)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    ks = (1, 2, 3, 17, 40, n // 2, n - 2, n - 1)
    check(rng.standard_normal(n), ks)
    check(rng.integers(0, 7, n).astype(np.float64), ks)
    check(rng.integers(0, 7, n).astype(np.float32), ks)


def test_ranked_ties_across_the_cut_keep_the_lowest_ids():
    """Scores 5, 3, 3, 3, 1 (ids 0-4) with the cut inside the 3s, and 0.0 tied with -0.0."""
    scores = np.array([1.0, 3.0, 5.0, 3.0, 3.0, 0.0, -0.0, 0.0])
    assert ranked(scores, 2).tolist() == [2, 1]
    assert ranked(scores, 3).tolist() == [2, 1, 3]
    check(scores, range(1, 8))


def test_ranked_matches_with_infinities_nans_and_integers():
    """Masked logits (-inf), +inf, NaNs (several, so the k-th score is a NaN once k passes the
    numbers), and integer scores (whose negation can wrap): the sort's order every time."""
    rng = np.random.default_rng(7)
    scores = rng.standard_normal(500)
    scores[rng.choice(500, 60, replace=False)] = -np.inf
    check(scores, (5, 439, 440, 441, 499))
    scores[[3, 90]] = np.inf
    scores[rng.choice(500, 30, replace=False)] = np.nan
    check(scores, (1, 2, 3, 40, 465, 470, 475, 499))
    check(np.array([0, 5, 3, 7, 5], dtype=np.uint8), (1, 2, 3, 4))
    check(np.array([-128, 5, 3, 127, 5], dtype=np.int8), (1, 2, 3, 4))
    with pytest.raises(ValueError):
        ranked(np.zeros((2, 3)), 2)


def test_the_samplers_distribution_is_the_full_sorts(tiny_model):
    """The correct order's candidates and probabilities at a 128256-token vocabulary (Llama 3's) and
    a top-k equal those the full sort gives; the GPU sampler's candidates equal the host's."""
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
