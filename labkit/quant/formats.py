"""One record per GGUF tensor type: what a block holds, how the GPU reads it, how to write one.

Everything else that used to keep its own list of formats derives from QUANT_FORMATS, as ggml's
test-backend-ops loops over all types: the host dequantizer's supported types and row sizes
(model/dequant.py), the matmul kernel families and their drivers (ops/matmul/__init__.py), the random
weights of the tiny and real-shape files (model/tiny.py, model/shaped.py) and the tests' format
lists. A type is here only if gguf.quants dequantizes it: that is the reference's reader and the
tests' oracle.

Block layouts are ggml's (ggml-common.h, dequantize_row_* in ggml-quants.c), as gguf-py's
numpy port (gguf/quants.py) reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.quant import random_blocks

Q = GGMLQuantizationType

# how a matmul reads the weight on the GPU (ops/matmul/__init__.py composes a kernel per layout):
# row / wg_reduce / wg_tile: the GGUF bytes themselves; repacked: int8 quants + per-group f32 scales;
# blocks: the GGUF blocks in a texture, read by the format's own drivers
RAW_LAYOUTS = ("row", "wg_reduce", "wg_tile")


@dataclass(frozen=True)
class QuantFormat:
    """A GGUF type as labkit reads it. `group` is the values sharing one (scale, offset) in the
    WGSL reader's parts4 (its quant_<name>.wgsl declares the same GROUP); `fields` are the block's
    f16 scale fields as (byte offset, multiple of the block's scale) for random blocks."""

    qtype: GGMLQuantizationType
    name: str  # kernel family suffix and reader file: matmul_<name>, quant_<name>.wgsl
    kind: str  # float, legacy, k-quant, i-quant, ternary, fp4
    group: int
    what: str  # what one block stores, in one line
    layouts: tuple[str, ...] = RAW_LAYOUTS + ("repacked",)
    cpu_default: str = "repacked"  # the layout a CPU adapter (lavapipe) reads by default
    tables: tuple[str, ...] = ()  # generated WGSL tables its reader indexes (ops/quant_tables.py)
    fields: tuple[tuple[int, float], ...] = ((0, 1.0),)
    quantizable: bool = False  # gguf.quants.quantize writes it (else tests write random blocks)

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]

    @property
    def type_name(self) -> str:
        return self.qtype.name

    @property
    def scale_at(self) -> int | None:
        """Byte offset of the block's f16 scale d, where it has one (MXFP4, NVFP4 and IQ1_M store
        their scales otherwise)."""
        return self.fields[0][0] if self.fields else None

    @property
    def repacks(self) -> bool:
        """Its quants are integers in int8 range, so the repacked int8 layout holds it."""
        return "repacked" in self.layouts

    def row_bytes(self, n_cols: int) -> int | None:
        """Bytes of a row of n_cols values; None when n_cols is not a whole number of blocks."""
        return None if n_cols % self.block_size else n_cols // self.block_size * self.block_bytes

    def random_blocks(self, rng: np.random.Generator, n_blocks: int, scale: float = 0.05) -> np.ndarray:
        """n_blocks random valid blocks, uint8 [n_blocks, block_bytes]: random quants, each block's
        scale in [0.5, 1] x `scale` (random halves for the float types). Valid means every field
        decodes as ggml's quantizer could have written it: finite scales, ternary digits 0..2."""
        return random_blocks.write(self, rng, n_blocks, scale)


def _float(qtype: Q, name: str, what: str) -> QuantFormat:
    return QuantFormat(qtype, name, "float", 4, what, layouts=RAW_LAYOUTS, cpu_default="row", fields=())


_GRID2 = ("ksigns",)  # the I-quants' sign table: 7 stored bits + parity

FORMATS_LIST = (
    _float(Q.F32, "f32", "one float32 per value"),
    _float(Q.F16, "f16", "one float16 per value"),
    _float(Q.BF16, "bf16", "one bfloat16 per value (the top half of a float32)"),
    QuantFormat(Q.Q8_0, "q8_0", "legacy", 32, "32 values: f16 d, 32 int8 quants; d·q",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), quantizable=True),
    QuantFormat(Q.Q4_0, "q4_0", "legacy", 32, "32 values: f16 d, 16 bytes of 4-bit quants; d·(q−8)",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), quantizable=True),
    QuantFormat(Q.Q4_1, "q4_1", "legacy", 32, "32 values: f16 d and m, 4-bit quants; d·q + m",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), fields=((0, 1.0), (2, -7.5)), quantizable=True),
    QuantFormat(Q.Q5_0, "q5_0", "legacy", 32, "32 values: f16 d, 32 high bits, 4-bit quants; d·(q−16)",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), quantizable=True),
    QuantFormat(Q.Q5_1, "q5_1", "legacy", 32, "32 values: f16 d and m, 32 high bits, 4-bit quants; d·q + m",
                fields=((0, 1.0), (2, -15.5)), quantizable=True),
    QuantFormat(Q.Q2_K, "q2_k", "k-quant", 16,
                "256 values: 16 sub-blocks of 16 with a 4-bit scale and min, 2-bit quants, f16 d and dmin",
                fields=((80, 1.0), (82, 1.5))),
    QuantFormat(Q.Q3_K, "q3_k", "k-quant", 16,
                "256 values: 2 low bits + a high-bit mask (set = no −4), 16 6-bit scales (−32), f16 d",
                fields=((108, 1.0),)),
    QuantFormat(Q.Q4_K, "q4_k", "k-quant", 32,
                "256 values: 8 sub-blocks of 32 with a 6-bit scale and min, 4-bit quants, f16 d and dmin",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), cpu_default="blocks", fields=((0, 1.0), (2, 7.5))),
    QuantFormat(Q.Q5_K, "q5_k", "k-quant", 32, "256 values: as Q4_K with a fifth bit per quant",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), cpu_default="blocks", fields=((0, 1.0), (2, 15.5))),
    QuantFormat(Q.Q6_K, "q6_k", "k-quant", 16, "256 values: 4 low + 2 high bits (−32), 16 int8 scales, f16 d",
                layouts=RAW_LAYOUTS + ("repacked", "blocks"), cpu_default="blocks", fields=((208, 1.0),)),
    QuantFormat(Q.IQ4_NL, "iq4_nl", "i-quant", 32,
                "32 values: f16 d, 4-bit indices into a 16-value non-linear table; d·kvalues[q]",
                tables=("kvalues_iq4nl",)),
    QuantFormat(Q.IQ4_XS, "iq4_xs", "i-quant", 32,
                "256 values: IQ4_NL's table, a 6-bit scale (−32) per 32 values, f16 d",
                tables=("kvalues_iq4nl",)),
    QuantFormat(Q.IQ3_XXS, "iq3_xxs", "i-quant", 32,
                "256 values: 8-bit indices into a 256 x 4 grid, 7-bit sign codes, a 4-bit scale per 32",
                tables=("iq3xxs_grid", *_GRID2)),
    QuantFormat(Q.IQ3_S, "iq3_s", "i-quant", 32,
                "256 values: 9-bit indices into a 512 x 4 grid, one sign bit per value, a 4-bit scale per 32",
                tables=("iq3s_grid",)),
    QuantFormat(Q.IQ2_XXS, "iq2_xxs", "i-quant", 32,
                "256 values: 8-bit indices into a 256 x 8 grid, 7-bit sign codes, a 4-bit scale per 32",
                tables=("iq2xxs_grid", *_GRID2)),
    QuantFormat(Q.IQ2_XS, "iq2_xs", "i-quant", 16,
                "256 values: 9-bit indices into a 512 x 8 grid, 7-bit sign codes, a 4-bit scale per 16",
                tables=("iq2xs_grid", *_GRID2)),
    QuantFormat(Q.IQ2_S, "iq2_s", "i-quant", 16,
                "256 values: 10-bit indices into a 1024 x 8 grid, one sign bit per value, a 4-bit scale per 16",
                tables=("iq2s_grid",)),
    QuantFormat(Q.IQ1_S, "iq1_s", "i-quant", 32,
                "256 values: 11-bit indices into a 2048 x 8 grid of −1/0/1, ±1/8 shift and 3-bit scale per 32",
                tables=("iq1s_grid",)),
    QuantFormat(Q.IQ1_M, "iq1_m", "i-quant", 16,
                "256 values: IQ1_S's grid, ±1/8 shift per 8, 3-bit scale per 16, f16 d split over 4 nibbles",
                tables=("iq1s_grid",), fields=()),
    QuantFormat(Q.TQ1_0, "tq1_0", "ternary", 256, "256 values: base-3 digits, 5 to a byte, f16 d; d·(t−1)",
                fields=((52, 1.0),), quantizable=True),
    QuantFormat(Q.TQ2_0, "tq2_0", "ternary", 256, "256 values: 2-bit ternary digits 0..2, f16 d; d·(t−1)",
                fields=((64, 1.0),), quantizable=True),
    QuantFormat(Q.MXFP4, "mxfp4", "fp4", 32, "32 values: an E8M0 power-of-two scale, 4-bit E2M1 values",
                tables=("kvalues_mxfp4",), fields=(), quantizable=True),
    QuantFormat(Q.NVFP4, "nvfp4", "fp4", 16, "64 values: an unsigned E4M3 scale per 16, 4-bit E2M1 values",
                tables=("kvalues_mxfp4",), fields=()),
)  # fmt: skip

QUANT_FORMATS: dict[GGMLQuantizationType, QuantFormat] = {f.qtype: f for f in FORMATS_LIST}
BY_NAME: dict[str, QuantFormat] = {f.name: f for f in FORMATS_LIST}


def quant_format(ggml_type: int) -> QuantFormat | None:
    """The record of a ggml type, or None when labkit does not read it."""
    try:
        return QUANT_FORMATS.get(Q(int(ggml_type)))
    except ValueError:
        return None


def type_label(ggml_type: int) -> str:
    """'Q4_K (ggml type 12)', or 'unknown ggml type N' for a number ggml does not define."""
    try:
        return f"{Q(int(ggml_type)).name} (ggml type {int(ggml_type)})"
    except ValueError:
        return f"unknown ggml type {ggml_type}"
