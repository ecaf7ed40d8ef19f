"""The KV cache's types in numpy (labkit.quant.cache_types) against ggml's own cache write, bit for bit.

llama.cpp's CPU cache write is each type's `from_float`: quantize_row_<type>_ref (IQ4_NL's without the
scale search), ggml_fp32_to_fp16_row and the bf16 reference rounding; the float64 reference stores what
`round_trip` gives, so it must be the same bytes. The GPU's writer is held to `round_trip` by the op cases
(tests/ops/test_ops.py, kv_cache)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from labkit.errors import InvalidArgumentError
from labkit.model.cache_stages import cache_types
from labkit.quant.cache_types import IQ4_NL_VALUES, KV_TYPES, dequantize_rows, quantize_rows, round_trip, row_bytes

from conftest import needs_llama


def _ggml():
    import llama_cpp

    return ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))


def _rows(seed: int) -> np.ndarray:
    """Rows whose blocks of 32 differ in scale by up to 1e4, with a zero block and exact ties for roundf."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((24, 256)) * np.repeat(10.0 ** r.uniform(-2, 2, (24, 8)), 32, axis=1)
    x[3, 64:96] = 0.0
    x[5, :32] = np.arange(32) - 15.5  # halves: roundf takes them away from zero
    return x.astype(np.float32)


@needs_llama
@pytest.mark.parametrize("t", [t for t in KV_TYPES if t != "f32"])
def test_each_type_writes_ggml_s_bytes(t):
    lib, x = _ggml(), _rows(7)
    fn = {"f16": "ggml_fp32_to_fp16_row", "bf16": "ggml_fp32_to_bf16_row_ref"}.get(t, f"quantize_row_{t}_ref")
    want = np.zeros((x.shape[0], row_bytes(t, x.shape[1])), np.uint8)
    for i, row in enumerate(x):
        getattr(lib, fn)(row.ctypes.data_as(ctypes.c_void_p), want[i].ctypes.data_as(ctypes.c_void_p),
                         ctypes.c_int64(x.shape[1]))  # fmt: skip
    got = quantize_rows(x, t)
    if t == "iq4_nl":  # a zero block's indices are whatever ggml's buffer held; its values are zero either way
        live = np.abs(x.reshape(-1, 32)).max(axis=1) > 0
        got, want = got.reshape(-1, 18)[live], want.reshape(-1, 18)[live]
    assert np.array_equal(got, want), f"{t}: {(got != want).sum()} bytes differ from ggml's"


def test_round_trip_is_the_cache_s_values_and_keeps_shape():
    x = _rows(3).astype(np.float64).reshape(4, 6, 256)
    for t in KV_TYPES:
        back = round_trip(x, t)
        assert back.shape == x.shape and back.dtype == np.float64
        step = {"f32": 1e-7, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2, "q5_0": 7e-2, "q5_1": 5e-2}.get(t, 0.3)
        rel = np.abs(back - x).max(axis=-1) / np.abs(x).max(axis=-1)
        assert rel.max() <= step, f"{t}: rounding error {rel.max():.2e} of the row's largest value"
        assert np.array_equal(round_trip(back, t), back) or t == "iq4_nl", f"{t}: rounding twice moves values"
    assert np.array_equal(dequantize_rows(quantize_rows(x[0], "q8_0"), "q8_0", 256), round_trip(x[0], "q8_0"))


def test_the_iq4_nl_table_is_ggml_s():
    assert IQ4_NL_VALUES.tolist() == [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def test_an_unknown_kv_type_is_refused_by_name():
    with pytest.raises(InvalidArgumentError, match=r"kv_type='q3_k'.*q8_0"):
        cache_types("q3_k")
    with pytest.raises(InvalidArgumentError, match="kv_type_v"):
        cache_types(kv_type_v="int4")
    assert str(cache_types("Q8_0")) == "q8_0"
    assert str(cache_types(kv_type_k="q8_0", kv_type_v="f16")) == "K q8_0, V f16"
