"""The matmul's kernels as one table, and the one rule that picks the default among them.

Each row is a correct kernel a format may have: the variant name `lab.use` selects, the weight
layout it reads, and its two drivers (one for passes of up to `short_max` tokens, one past that).
A format has a row when its record (labkit.quant.formats) lists the row's layout; `default_kernel`
is the only place a stage's default matmul kernel is decided, for the adapter kind and the weight
layout the memory plan allows, and every caller (kernel selection, `get_kernel("default")`, the
variant listing) asks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.quant.formats import BY_NAME

# Up to this many tokens a matmul on repacked or blocks weights runs the decode driver (a pass of
# it per token, in one dispatch), not the 16-token tile, whose work is the same for 1 token as for
# 16. On lavapipe (AMD EPYC family 25, 2 cores, best of 5, alternating), matvec against tile:
# Q4_K blocks 8192 x 2048 T=2 8.9 / 21.0 ms, T=4 16.7 / 24.5, T=6 25.9 / 24.7; Q6_K 2048 x 8192
# T=4 22.7 / 28.0; int8 2048 x 2048 T=3 4.9 / 7.5, T=4 5.6-7.0 / 6.8-6.9. A Llama-3.2-1B-shaped
# pass: T=2 0.51 / 1.39 s, T=3 0.79 / 1.79 s, T=4 1.20 / 1.16 s, so 4 tokens stay on the tile.
MATVEC_MAX_T = 3
# Up to this many tokens the repacked weights' few-token driver (matvec4) runs: each weight word
# decoded once for 4 tokens, and each token's sums in matvec's order (a batch's decode step gets
# every sequence's bits of its own step).
FEW_MAX_T = 4
# wg_tile runs wg_reduce's driver up to this many tokens. On an H200 (the tile's 64 x 64 in one
# workgroup), 1B shape: T=64 wg_reduce 0.104 s, tile 0.122 s (32 workgroups for 2048 rows); T=512
# 0.659 s against 0.333 s. 8B shape, T=64: 0.394 against 0.367 s.
WG_REDUCE_MAX_T = 64

SPLITK_FORMATS = ("q4_k", "q5_k", "q6_k")  # formats with a split-K decode driver (for real GPUs)


@dataclass(frozen=True)
class MatmulKernel:
    """One row of the table: a correct kernel, the layout it reads, its drivers by token count."""

    variant: str  # what lab.use("matmul_<fmt>", variant) selects
    layout: str  # "repacked" (int8, rewritten on the GPU), "blocks" (GGUF blocks in a texture), "gguf" (the bytes)
    short: str  # the driver for passes of up to short_max tokens
    long: str  # the driver past that
    short_max: int
    doc: str
    few: str = ""  # the driver for 2 to FEW_MAX_T tokens, where the row has one (else `short` or `long`)

    def driver(self, T: int) -> str:
        """The driver a pass of T tokens runs."""
        if self.few and 1 < T <= FEW_MAX_T:
            return self.few
        return self.short if T <= self.short_max else self.long


TABLE = (
    MatmulKernel("repacked", "repacked", "matvec", "tiled", MATVEC_MAX_T,
                 "weights repacked on the GPU to aligned int8; 16x8 tiles for prefill, "
                 "a row quad per thread for decode, for 2 to 4 tokens at once", few="matvec4"),
    MatmulKernel("blocks", "blocks", "matvec", "tiled", MATVEC_MAX_T,
                 "GGUF blocks in a texture, near the format's own width; 16x8 tiles for prefill, "
                 "a row quad for decode"),
    MatmulKernel("blocks_splitk", "blocks", "splitk", "tiled", MATVEC_MAX_T,
                 "GGUF blocks in a texture, as `blocks`; for decode, 64 threads split each 4 rows' blocks "
                 "(enough workgroups for a real GPU)"),
    MatmulKernel("row", "gguf", "row", "row", 0, "rows per thread on the GGUF bytes, token tiles"),
    MatmulKernel("wg_reduce", "gguf", "wg_reduce", "wg_reduce", 0,
                 "one workgroup per row on the GGUF bytes, shared-memory reduction (for real GPUs)"),
    MatmulKernel("wg_tile", "gguf", "wg_reduce", "wg_tile", WG_REDUCE_MAX_T,
                 "on the GGUF bytes for real GPUs: a prefill past 64 tokens in 64-row x 64-token tiles through "
                 "workgroup memory, shorter passes as wg_reduce"),
)  # fmt: skip
BY_VARIANT = {k.variant: k for k in TABLE}


def kernels_of(fmt: str) -> list[MatmulKernel]:
    """The rows a format has: every GGUF-bytes kernel, and those of the other layouts its record lists."""
    layouts = BY_NAME[fmt].layouts
    return [
        k
        for k in TABLE
        if (k.layout == "gguf" or k.layout in layouts) and (k.variant != "blocks_splitk" or fmt in SPLITK_FORMATS)
    ]


def default_kernel(fmt: str, adapter: str, weight_layout: str = "repacked") -> tuple[str, str]:
    """(the variant "default" means for a format, why: "" when it is the adapter's plain default).

    A real GPU reads the GGUF bytes (wg_tile). A CPU adapter (lavapipe) reads the layout the format's
    record names (`cpu_default`: int8, blocks, or the bytes for float formats), unless the memory plan
    narrowed the weights: to the blocks layout where the format has one, else to GGUF bytes."""
    if adapter == "gpu":
        return "wg_tile", ""
    own = {"repacked": "repacked", "blocks": "blocks", "row": "row"}[BY_NAME[fmt].cpu_default]
    if weight_layout == "repacked" or BY_VARIANT[own].layout == "gguf":
        return own, ""
    if weight_layout == "blocks" and "blocks" in BY_NAME[fmt].layouts:
        return (
            "blocks",
            "default for weights kept near their GGUF width (the int8 layout does not fit the memory budget)",
        )
    return "row", "default for weights kept as GGUF bytes (the repacked layout does not fit the memory budget)"
