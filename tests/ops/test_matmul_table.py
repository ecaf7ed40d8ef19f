"""The matmul's one table (labkit.ops.matmul.table): which kernels a format has, the driver each runs
for a token count, and the one default every caller gets."""

import pytest

from labkit.gpu.kernel_selection import choose
from labkit.model.graph import Stage
from labkit.ops.base import PassShape
from labkit.ops.matmul.table import BY_VARIANT, FEW_MAX_T, MATVEC_MAX_T, WG_REDUCE_MAX_T, default_kernel, kernels_of
from labkit.ops.registry import KERNELS, get_kernel, preferred
from labkit.quant.formats import FORMATS_LIST

# (format, adapter, weight layout) -> the default, written out by hand from the measurements the
# table's docstrings cite: K-quants read the blocks layout on lavapipe, legacy and I-quants int8,
# float formats their bytes; a real GPU reads the bytes; a narrowed plan reads what fits
EXPECTED = {
    ("q4_k", "cpu", "repacked"): "blocks",
    ("q6_k", "cpu", "repacked"): "blocks",
    ("q8_0", "cpu", "repacked"): "repacked",
    ("iq2_xxs", "cpu", "repacked"): "repacked",
    ("f16", "cpu", "repacked"): "row",
    ("q4_k", "gpu", "repacked"): "wg_tile",
    ("q8_0", "gpu", "gguf"): "wg_tile",
    ("q8_0", "cpu", "blocks"): "blocks",
    ("q4_k", "cpu", "blocks"): "blocks",
    ("iq2_xxs", "cpu", "blocks"): "row",  # no blocks layout: the bytes
    ("q4_k", "cpu", "gguf"): "row",
    ("f16", "cpu", "gguf"): "row",
}


STAGE = Stage(
    "blk.0.attn_q", "matmul", ("blk.0.attn_norm",), "blk.0.attn_q.weight", layer=0, params={"in": 64, "out": 64}
)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_the_default_of_a_format_on_an_adapter_under_a_weight_layout(key):
    fmt, adapter, layout = key
    assert default_kernel(fmt, adapter, layout)[0] == EXPECTED[key]


def test_every_caller_gets_the_tables_default():
    """kernel selection, get_kernel("default") and the registry's prefer marks give what the table
    says, for every format; a narrowed default reads a layout the weights are kept in."""
    stage = STAGE
    for f in FORMATS_LIST:
        fam = f"matmul_{f.name}"
        # the registry's kernels of the table's names (a session may have registered a user's too)
        assert [k.variant for k in kernels_of(f.name)] == [n for n in KERNELS[fam] if n in BY_VARIANT]
        for adapter, adapter_type in (("cpu", "CPU"), ("gpu", "DiscreteGPU")):
            plain = default_kernel(f.name, adapter)[0]
            assert preferred(fam, adapter).name == plain == get_kernel(fam, "default", adapter).name
            for layout in ("repacked", "blocks", "gguf"):
                name, why = default_kernel(f.name, adapter, layout)
                chosen = choose(stage, fam, {}, adapter_type, layout)
                assert chosen.kernel.name == name and (not why or chosen.why == why), (f.name, adapter, layout)
                reads = BY_VARIANT[name].layout
                assert reads in ("gguf", layout) or layout == "repacked", (f.name, adapter, layout, reads)


def test_a_selected_variant_wins_over_the_table():
    stage = STAGE
    chosen = choose(stage, "matmul_q4_k", {"matmul_q4_k": "mins_added"}, "CPU", "gguf")
    assert chosen.kernel.name == "mins_added" and chosen.why == "selected (matmul_q4_k)"


@pytest.mark.parametrize("variant", sorted(BY_VARIANT))
def test_each_kernels_driver_by_token_count(variant):
    """Decode and short prompts run the short driver, up to the measured crossover; past it, the long one."""
    row = BY_VARIANT[variant]
    limit = {"repacked": MATVEC_MAX_T, "blocks": MATVEC_MAX_T, "blocks_splitk": MATVEC_MAX_T,
             "wg_tile": WG_REDUCE_MAX_T}.get(variant, 0)  # fmt: skip
    assert row.driver(1) == (row.short if limit else row.long)
    if row.few:  # 2 to FEW_MAX_T tokens (a batch's decode step) on their own driver, then the long one
        assert [row.driver(t) for t in range(2, FEW_MAX_T + 2)] == [row.few] * (FEW_MAX_T - 1) + [row.long]
        return
    assert row.driver(limit + 1) == row.long and row.driver(max(limit, 1)) == (row.short if limit else row.long)
    source = get_kernel("matmul_q4_k", variant, "cpu").source
    assert source(PassShape(1, 0)) != source(PassShape(limit + 1, 0)) or row.short == row.long
