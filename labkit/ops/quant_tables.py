"""The lookup tables of the I-quant and FP4 readers, generated from gguf.quants' own constants.

The grids (iq2xxs_grid, iq1s_grid, ...), the sign table and the non-linear value tables are read
from one place, the numpy oracle the tests compare with, so a WGSL table cannot drift from it.
They live in one read-only storage buffer, QUANT_TABLES, at @group(1) @binding(0): `table_words()`
is its contents, and the generated `table_quant` file (composed before a reader that needs it,
ops/base.py: wgsl_file) declares it with each table's offset and accessor.

Why a buffer, not a WGSL array (measured on lavapipe, 2 cores): a `const` array indexed at run
time is copied per access (16M lookups into 2048 words: 19.6 s, against 17 ms from a buffer); a
`var<private>` one runs at 36 ms, but its compile time grows with table size times call sites
(a raw-bytes matmul reading IQ1_S's 4096-word grid took 200 s to build).

Grids hold their values as int8 bytes, four to a u32, little-endian: entry i of an 8-wide grid is
words 2i and 2i + 1, of a 4-wide grid word i.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from gguf import quants

GRIDS = {
    "iq2xxs_grid": quants.IQ2_XXS,
    "iq2xs_grid": quants.IQ2_XS,
    "iq2s_grid": quants.IQ2_S,
    "iq3xxs_grid": quants.IQ3_XXS,
    "iq3s_grid": quants.IQ3_S,
    "iq1s_grid": quants.IQ1_S,
}
VALUE_TABLES = {"kvalues_iq4nl": quants.IQ4_NL.kvalues, "kvalues_mxfp4": quants.MXFP4.kvalues}
TABLE_GROUP = 1  # the bind group of QUANT_TABLES: a reader's kernel keeps its own bindings in group 0


def grid_words(name: str) -> np.ndarray:
    """A grid's entries as int8 bytes packed in u32 words (uint32 [entries x width / 4])."""
    cls = GRIDS[name]
    cls.init_grid()
    values = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    return np.ascontiguousarray(values.astype(np.int8)).view("<u4").reshape(-1)


def ksigns() -> np.ndarray:
    """ggml's ksigns_iq2xs: 7 stored sign bits of 8 values, the 8th their parity."""
    return np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).astype(np.uint32)


@lru_cache(maxsize=1)
def _tables() -> dict[str, np.ndarray]:
    out = {name: grid_words(name) for name in GRIDS}
    out["ksigns"] = ksigns()
    out |= {name: np.array(v, dtype=np.int32).view(np.uint32) for name, v in VALUE_TABLES.items()}
    return out


def table_words() -> np.ndarray:
    """QUANT_TABLES' contents: every table, one after another (uint32)."""
    return np.concatenate(list(_tables().values()))


def offsets() -> dict[str, int]:
    """Each table's first word in QUANT_TABLES."""
    sizes = [t.size for t in _tables().values()]
    return dict(zip(_tables(), np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))


@lru_cache(maxsize=1)
def tables_wgsl() -> str:
    """The binding, an accessor per table (`iq2xxs_grid(i)`, `ksigns(i)`), and for the 16-value
    tables `lookup_<name>(nib)`: four 4-bit codes, one per byte of nib, as values."""
    lines = [
        "// generated from gguf.quants by labkit/ops/quant_tables.py",
        f"@group({TABLE_GROUP}) @binding(0) var<storage, read> QUANT_TABLES: array<u32>;",
    ]
    for name, at in offsets().items():
        if name in VALUE_TABLES:
            picks = ", ".join(f"f32(bitcast<i32>(QUANT_TABLES[{at}u + ((nib >> {8 * i}u) & 15u)]))" for i in range(4))
            lines.append(f"fn lookup_{name}(nib: u32) -> vec4<f32> {{\n    return vec4<f32>({picks});\n}}")
        else:
            lines.append(f"fn {name}(i: u32) -> u32 {{\n    return QUANT_TABLES[{at}u + i];\n}}")
    return "\n".join(lines) + "\n"
