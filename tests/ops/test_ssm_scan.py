"""Mamba-2's scan in its two forms: the chunked one (state-space duality, how engines run a prompt)
and the recurrent one (token by token, how they decode) compute one thing, in float64 to 1e-12;
and a prompt split in two passes, the state carried between them, equals one pass."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.ops.ssm_conv import causal_conv
from labkit.ops.ssm_scan import scan_chunked, scan_recurrent, softplus


def _inputs(seed: int, T: int, H: int = 3, P: int = 5, N: int = 7):
    r = np.random.default_rng(seed)
    x = r.standard_normal((T, H, P))
    dt = softplus(r.standard_normal((T, H)) - 1.0)
    A = -r.uniform(0.5, 8.0, H)
    B, C = r.standard_normal((T, H, N)), r.standard_normal((T, H, N))
    return x, dt, A, B, C, r.standard_normal((H, P, N))


def nmse(a, b) -> float:
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


@pytest.mark.parametrize("chunk", [1, 4, 7, 16, 64])
def test_chunked_and_recurrent_forms_agree(chunk):
    x, dt, A, B, C, s0 = _inputs(chunk, T=37)
    y_r, s_r = scan_recurrent(x, dt, A, B, C, s0)
    y_c, s_c = scan_chunked(x, dt, A, B, C, s0, chunk=chunk)
    assert nmse(y_c, y_r) < 1e-24 and nmse(s_c, s_r) < 1e-24  # 1e-12 relative


def test_two_passes_carrying_the_state_equal_one():
    x, dt, A, B, C, s0 = _inputs(3, T=20)
    y, s = scan_chunked(x, dt, A, B, C, s0, chunk=8)
    y1, s1 = scan_chunked(x[:11], dt[:11], A, B[:11], C[:11], s0, chunk=8)
    y2, s2 = scan_recurrent(x[11:], dt[11:], A, B[11:], C[11:], s1)
    assert nmse(np.concatenate([y1, y2]), y) < 1e-24 and nmse(s2, s) < 1e-24
    y_fresh, _ = scan_recurrent(x[11:], dt[11:], A, B[11:], C[11:], np.zeros_like(s1))
    assert nmse(y_fresh, y[11:]) > 1e-6  # the carried state matters: a reset one is another answer


def test_softplus_is_ggmls():
    """Above 20 the value itself (ggml_compute_softplus_f32), below log(1 + e^x), with no overflow."""
    x = np.array([-50.0, -1.0, 0.0, 19.9, 20.0, 20.1, 1000.0])
    want = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    np.testing.assert_array_equal(softplus(x), want)
    assert softplus(np.array([1000.0]))[0] == 1000.0


def test_the_conv_continues_its_state_across_passes():
    r = np.random.default_rng(5)
    x, w, b = r.standard_normal((9, 6)), r.standard_normal((6, 4)), r.standard_normal(6)
    y, s = causal_conv(x, w, b, np.zeros((6, 3)))
    y1, s1 = causal_conv(x[:2], w, b, np.zeros((6, 3)))  # fewer tokens than the kept window
    y2, s2 = causal_conv(x[2:], w, b, s1)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(s2, s, rtol=0, atol=0)
    np.testing.assert_array_equal(s, x[-3:].T)  # the state is each channel's last d_conv - 1 inputs
