"""The gated delta rule in its two forms: the chunked one (the UT transform inside a chunk, how engines run
a prompt) and the recurrent one (token by token, how they decode) compute one thing, in float64 to
1e-12, across chunk edges; a prompt split in two passes, the memory carried between them, equals one;
and the rule is what its name says: with no decay and beta 1, a key written once reads back its value."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.ops.delta_net import delta_chunked, delta_recurrent


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _inputs(seed: int, T: int, H: int = 3, d: int = 8):
    r = np.random.default_rng(seed)
    q, k = _unit(r.standard_normal((T, H, d))), _unit(r.standard_normal((T, H, d)))
    v, g = r.standard_normal((T, H, d)), -r.uniform(0.01, 2.0, (T, H))
    return q, k, v, g, r.uniform(0.05, 1.0, (T, H)), r.standard_normal((H, d, d))


def nmse(a, b) -> float:
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


@pytest.mark.parametrize("chunk", [1, 4, 7, 16, 64])
def test_chunked_and_recurrent_forms_agree(chunk):
    q, k, v, g, b, m0 = _inputs(chunk, T=37)
    o_r, m_r = delta_recurrent(q, k, v, g, b, m0)
    o_c, m_c = delta_chunked(q, k, v, g, b, m0, chunk=chunk)
    assert nmse(o_c, o_r) < 1e-24 and nmse(m_c, m_r) < 1e-24  # 1e-12 relative


def test_two_passes_carrying_the_memory_equal_one():
    q, k, v, g, b, m0 = _inputs(3, T=20)
    o, m = delta_chunked(q, k, v, g, b, m0, chunk=8)
    o1, m1 = delta_chunked(q[:11], k[:11], v[:11], g[:11], b[:11], m0, chunk=8)
    o2, m2 = delta_recurrent(q[11:], k[11:], v[11:], g[11:], b[11:], m1)
    assert nmse(np.concatenate([o1, o2]), o) < 1e-24 and nmse(m2, m) < 1e-24


def test_a_key_written_with_full_strength_reads_back_its_value():
    """The delta rule corrects rather than adds: writing v under a unit key k with beta 1 and no decay
    makes M k = v exactly, whatever M held, so the query k reads v (times 1/sqrt(d))."""
    q, k, v, g, b, m0 = _inputs(5, T=1, H=2, d=16)
    o, m = delta_recurrent(k, k, v, np.zeros_like(g), np.ones_like(b), m0)
    assert np.allclose(np.einsum("hjk,hk->hj", m, k[0]), v[0]) and np.allclose(o[0] * 4.0, v[0])
