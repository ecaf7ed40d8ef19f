"""The per-type records (labkit/quant/formats.py) and the tables generated from gguf.quants."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from gguf.quants import dequantize

from labkit.ops.base import wgsl_const, wgsl_file
from labkit.ops.quant_tables import GRIDS, grid_words, ksigns, offsets, table_words
from labkit.quant.formats import FORMATS_LIST, QUANT_FORMATS


@pytest.mark.parametrize("fmt", FORMATS_LIST, ids=lambda f: f.type_name)
def test_wgsl_reader_declares_the_records_geometry(fmt):
    """The reader's QK, BLOCK_BYTES and GROUP are the record's (a float type reads 4 values a block)."""
    src = wgsl_file(f"quant_{fmt.name}")
    qk = 4 if fmt.kind == "float" else fmt.block_size
    assert wgsl_const(src, "QK", 0) == qk
    assert wgsl_const(src, "BLOCK_BYTES", 0) == qk * fmt.block_bytes // fmt.block_size
    assert wgsl_const(src, "GROUP", 0) == fmt.group
    uses_tables = any(f"{t}(" in src for t in (*GRIDS, "ksigns")) or "lookup_kvalues_" in src
    assert uses_tables == bool(fmt.tables), f"{fmt.type_name}: tables {fmt.tables}"


@pytest.mark.parametrize("fmt", FORMATS_LIST, ids=lambda f: f.type_name)
def test_random_blocks_are_valid(fmt):
    """Finite values of about the asked size; ternary digits stop at 2 (gguf.quants would decode a
    3 as 2d, which the quantizer never writes)."""
    raw = fmt.random_blocks(np.random.default_rng(int(fmt.qtype)), 200, 0.05)
    assert raw.shape == (200, fmt.block_bytes) and raw.dtype == np.uint8
    v = dequantize(raw, fmt.qtype)
    assert np.isfinite(v).all() and v.std() > 0
    if fmt.qtype == Q.TQ2_0:
        digits = raw[:, :64, None] >> np.array([0, 2, 4, 6], np.uint8) & 3
        assert digits.max() == 2


def test_ksigns_is_seven_bits_and_their_parity():
    """ggml's ksigns_iq2xs, as gguf.quants holds it: entry i is i with bit 7 set when i has an odd
    number of bits (8 signs with an even number of minus signs)."""
    i = np.arange(128)
    parity = np.array([bin(x).count("1") & 1 for x in i])
    assert (ksigns() == i | parity << 7).all()


@pytest.mark.parametrize("name", list(GRIDS))
def test_grid_words_hold_gguf_quants_grid(name):
    """Each grid entry as int8 bytes, little-endian in u32 words: gguf.quants' values, in order."""
    cls = GRIDS[name]
    cls.init_grid()
    back = grid_words(name).view(np.int8).reshape(cls.grid_shape)
    assert (back == np.asarray(cls.grid).reshape(cls.grid_shape)).all()


def test_table_buffer_offsets_address_each_table():
    words, at = table_words(), offsets()
    assert (words[at["ksigns"] : at["ksigns"] + 128] == ksigns()).all()
    kv = words[at["kvalues_iq4nl"] : at["kvalues_iq4nl"] + 16].view(np.int32)
    assert kv.tolist() == list(quants.IQ4_NL.kvalues)
    g = at["iq1s_grid"]
    assert (words[g : g + grid_words("iq1s_grid").size] == grid_words("iq1s_grid")).all()


def test_every_type_has_one_record():
    assert len(QUANT_FORMATS) == len(FORMATS_LIST) == len({f.name for f in FORMATS_LIST})
