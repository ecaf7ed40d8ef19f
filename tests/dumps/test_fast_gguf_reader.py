"""FastGGUFReader (what the hf dumps load GGUF files with) gives gguf-py's own reader's fields exactly.

Each field is compared part by part (dtype, shape, bytes), with its offset, data indices and types,
on a real model's file and on written files that hold every scalar type, strings (empty, non-ASCII)
and arrays of arrays, in both byte orders (gguf-py's writer refuses empty arrays).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from labkit.dumps.fast_gguf_reader import FastGGUFReader


def assert_same_fields(path) -> int:
    """The number of fields compared; fails with the first field and part that differ."""
    fast, slow = FastGGUFReader(path), gguf.GGUFReader(path)
    assert list(fast.fields) == list(slow.fields)
    for key, a in fast.fields.items():
        b = slow.fields[key]
        assert (a.offset, a.name, a.data, a.types) == (b.offset, b.name, b.data, b.types), key
        assert len(a.parts) == len(b.parts), key
        for i, (x, y) in enumerate(zip(a.parts, b.parts)):
            assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), f"{key} part {i}"
    assert fast.data_offset == slow.data_offset

    def located(t) -> tuple:  # where each tensor's bytes are and how they read (test_dequant relies on it)
        return t.name, int(t.tensor_type), t.shape.tolist(), t.n_elements, t.n_bytes, t.data_offset, t.data.shape

    assert [located(t) for t in fast.tensors] == [located(t) for t in slow.tensors]
    return len(fast.fields)


def test_a_real_models_fields_are_gguf_pys(smollm):
    assert assert_same_fields(smollm.path) > 20


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_in_either_byte_order(tmp_path, endian):
    rng = np.random.default_rng(7)
    path = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    scalar_kinds = [
        (gguf.GGUFValueType.UINT8, np.uint8), (gguf.GGUFValueType.INT8, np.int8),
        (gguf.GGUFValueType.UINT16, np.uint16), (gguf.GGUFValueType.INT16, np.int16),
        (gguf.GGUFValueType.UINT32, np.uint32), (gguf.GGUFValueType.INT32, np.int32),
        (gguf.GGUFValueType.UINT64, np.uint64), (gguf.GGUFValueType.INT64, np.int64),
        (gguf.GGUFValueType.FLOAT32, np.float32), (gguf.GGUFValueType.FLOAT64, np.float64),
    ]  # fmt: skip
    for vtype, dtype in scalar_kinds:
        values = rng.integers(0, 100, size=int(rng.integers(1, 40))).astype(dtype).tolist()
        w.add_key_value(f"test.array.{vtype.name}", values, gguf.GGUFValueType.ARRAY, sub_type=vtype)
        w.add_key_value(f"test.scalar.{vtype.name}", values[0], vtype)
    w.add_key_value("test.array.BOOL", [True, False, True], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL)
    w.add_array("test.strings", ["", "a", "héllo ▁world", "x" * 300, "\n"])
    w.add_array("test.nested", [[1, 2, 3], [4]])
    w.add_array("test.nested_strings", [["ab", "c"], ["d"]])
    w.add_string("test.string", "a string")
    tensor = rng.standard_normal((3, 5)).astype(np.float32)
    w.add_tensor("t", tensor if endian == gguf.GGUFEndian.LITTLE else tensor.byteswap())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert assert_same_fields(path) >= 2 * len(scalar_kinds) + 5
