"""matmul: a linear layer, y = x · Wᵀ (+ bias), with W read in its GGUF format on the GPU.

The file's bytes are uploaded unchanged. A kernel is composed from common.wgsl, the format's
block reader (quant_<fmt>.wgsl, transcribed from ggml's dequantize_row_*) and a driver:
- `repacked`: repack.wgsl, composed with the same block reader, first rewrites the weight on the
  GPU as aligned int8 quants with per-group scales; then matmul_tiled.wgsl (16 tokens x 8 rows per
  thread, prefill) or matmul_matvec.wgsl (4 rows per thread, decode) reads it.
- `blocks`, `blocks_splitk`: the GGUF blocks in a texture, near the format's own width.
- `row` (matmul.wgsl), `wg_reduce` (matmul_wg_reduce.wgsl) and `wg_tile` (matmul_wg_tile.wgsl past
  64 tokens, wg_reduce's driver below) read the GGUF bytes themselves.
Which kernels a format has, the driver each runs for a token count, and which one "default" means
on an adapter under the memory plan's weight layout are one table (labkit.ops.matmul.table).
Each weight format is its own kernel family (`matmul_q8_0`, `matmul_q4_k`, ...), so a format
fault (Q4_K mins added) binds to exactly the weights of that format; it lives in the block
reader, so it is repacked with the weight. The unembedding stage carries the `lm_head`
dispatch policy: which row windows of the weight get dispatched (post-mortem 002 left the
last one out).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType

from labkit.errors import UnsupportedTensorTypeError
from labkit.ops.base import Kernel, Op, Params, Policy, compose, wgsl_const, wgsl_file
from labkit.ops.matmul.table import BY_VARIANT, FEW_MAX_T, SPLITK_FORMATS, MatmulKernel, default_kernel, kernels_of
from labkit.quant.formats import BY_NAME, FORMATS_LIST

PARAMS = Params(
    K="u32", rows="u32", T="u32", row0="u32", x_offset="u32", x_stride="u32", y_offset="u32", y_stride="u32"
)

REPACK_PARAMS = Params(K="u32", rows="u32", row0="u32")

# the decode matvec fused with the elementwise stage after it (labkit.gpu.fusion): where the
# other input E is read and the result Z written, the gated activation's act, and whether the
# matmul's own value is the gate (glu's first input)
EPILOGUE_PARAMS = Params(**PARAMS.fields, e_offset="u32", z_offset="u32", act="u32", y_first="u32")
EPILOGUES = {"add": ("epilogue_add",), "glu": ("glu_act", "epilogue_glu")}  # op -> the files defining `epilogue`

# ggml type -> kernel family suffix, for every type the GPU reads (quant/formats.py)
FORMATS = {f.qtype: f.name for f in FORMATS_LIST}

# driver name -> kernel file (tiled is composed after tile16.wgsl)
DRIVERS = {"row": "matmul", "wg_reduce": "matmul_wg_reduce", "wg_tile": "matmul_wg_tile", "tiled": "matmul_tiled",
           "matvec": "matmul_matvec", "matvec4": "matmul_matvec4"}  # fmt: skip
# what a driver file is composed after: the row drivers share their X, W and Y access
DRIVER_HELPERS = {d: ("matmul_row_io",) for d in ("matmul", "moe_matmul", "moe_matmul_gathered")}
DRIVER_HELPERS["blocks_repack"] = ("blocks_quads",)  # where the layout puts each block
INTEGER_FORMATS = tuple(f.name for f in FORMATS_LIST if f.repacks)  # quants in int8 range: repackable
# formats with drivers on the blocks layout: format -> (files composed before the driver, the
# driver family: blocks_<family>_matvec.wgsl / _tiled.wgsl)
BLOCK_DRIVERS = {
    "q4_k": (("blocks_q4_k",), "k"),
    "q5_k": (("blocks_q5_k",), "k"),
    "q6_k": ((), "q6_k"),
    # the legacy formats' 32-value blocks, 8 to a group laid out by field (blocks_group.wgsl)
    "q8_0": (("blocks_group", "blocks_q8_0"), "group"),
    "q4_0": (("blocks_group", "blocks_q4_0"), "group"),
    "q4_1": (("blocks_group", "blocks_q4_1"), "group"),
    "q5_0": (("blocks_group", "blocks_q5_0"), "group"),
}
GROUP_BLOCKS = 8  # GGUF blocks per group of the grouped blocks layout
BLOCK_FORMATS = tuple(f.name for f in FORMATS_LIST if "blocks" in f.layouts)


def format_name(ggml_type: int) -> str:
    """'q8_0', 'q4_k', ... for a supported ggml type; UnsupportedTensorTypeError otherwise."""
    try:
        return FORMATS[GGMLQuantizationType(ggml_type)]
    except (KeyError, ValueError):
        try:
            name = GGMLQuantizationType(ggml_type).name
        except ValueError:
            name = "unknown"
        raise UnsupportedTensorTypeError(
            f"no GPU matmul for ggml type {ggml_type} ({name}); supported: " + ", ".join(t.name for t in FORMATS)
        ) from None


def family(stage, tensor_type) -> str:
    """`matmul_<fmt>` of the stage's weight."""
    return "matmul_" + format_name(tensor_type(stage.weight))


def reference(stage, ref) -> np.ndarray:
    """x · Wᵀ, times the weight's per-tensor scale (BitNet), plus the bias: llama.cpp's order."""
    y = ref.matmul(ref.x[0], stage.weight, stage.weight_rows)
    scale = stage.params.get("weight_scale")
    y = y * ref.weight(scale) if scale else y
    return y + ref.weight(stage.bias) if stage.bias else y


def workgroups(rows: int, T: int, rows_per_wg: int, tokens_per_wg: int) -> int:
    """One workgroup per ROWS_PER_WG weight rows and TOKENS_PER_WG tokens (declared in the driver)."""
    return -(-rows // rows_per_wg) * -(-T // tokens_per_wg)


def plan(stage, gpu):
    x = gpu.input(0)
    lm_head = stage.policy == "lm_head"
    rows_T, N = (1 if lm_head and gpu.last_only else gpu.T), stage.params["out"]
    out = gpu.output((rows_T, N))
    keep = gpu.policy("lm_head").window_filter if lm_head else None
    after = _after_product(stage, N)
    y = gpu.temp((rows_T, N), "product") if after else out  # the product, before its scale and bias
    gpu.matmul(x, y, rows_T, x_skip=gpu.T - rows_T, window_filter=keep, epilogue=_fused(gpu, rows_T, N))
    for i, (op, tensor, period) in enumerate(after):  # the last one writes the stage's region (v's: in the cache)
        dst = out if i == len(after) - 1 else gpu.temp((rows_T, N), op)
        values = {"n": rows_T * N, "period": period, "y_offset": dst.offset, "scale": 1.0}
        gpu.dispatch_op(op, [y.buffer, gpu.vector(tensor), dst.buffer], values, -(-rows_T * N // 64))
        y = dst
    return out


def _after_product(stage, N: int) -> list[tuple[str, str, int]]:
    """(op, tensor, period) applied to the product in order: the per-tensor scale, then the bias."""
    scale = stage.params.get("weight_scale")
    return [*([("mul", scale, 1)] if scale else []), *([("add", stage.bias, N)] if stage.bias else [])]


def _fused(gpu, rows_T: int, N: int) -> tuple[str, list, dict] | None:
    """In a decode step, the next stage's op computed in this dispatch (labkit.gpu.fusion decides
    which): (its op, its other input E and its region Z as extra bindings, their Params values)."""
    nxt = gpu.fused_next((rows_T, N)) if rows_T == gpu.T else None  # a decode step's, or a batch's (fusion decides)
    if nxt is None:
        return None
    ep, e, z = nxt
    return ep.stage.op, [e.buffer, z.buffer], ep.values(e.offset, z.offset)


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    rows = f" rows {stage.weight_rows[0]}:{stage.weight_rows[1]}" if stage.weight_rows else ""
    bias = [f"{stage.bias} [{P['out']}]"] if stage.bias else []
    return [f"[T, {P['in']}]", f"{stage.weight}{rows} [{P['out']}, {P['in']}]", *bias], f"[T, {P['out']}]"


# readers split at the step a faulty reader breaks: quant_<fmt>.wgsl calls a function that
# quant_<fmt>_<part>.wgsl defines, and a fault is a file of its own in that part's place
READER_PARTS = {"q3_k": "hmask", "q4_k": "mins", "iq2_xxs": "signs", "tq2_0": "offset", "mxfp4": "scale"}


def source(fmt: str, driver: str = "row", quant: str = "") -> str:
    """The composed WGSL of one matmul kernel: common + the format's generated tables (I-quant
    grids, FP4 values) + its reader (quant_<fmt>, then its part or the fault `quant` in the part's
    place; a format without parts: quant_<fmt>[_<quant>]) + the driver."""
    part = READER_PARTS.get(fmt)
    if part:
        reader = [f"quant_{fmt}", f"quant_{fmt}_{quant or part}"]
    else:
        reader = [f"quant_{fmt}" + (f"_{quant}" if quant else "")]
    tables = ["quant_tables"] * bool(BY_NAME[fmt].tables)
    drv = DRIVERS.get(driver, driver)
    return compose("common", *tables, *reader, *DRIVER_HELPERS.get(drv, ()), drv)


def group_of(fmt: str) -> int:
    """Values per (scale, offset) of a format (its quant file's GROUP): 32, or 16 for Q6_K."""
    return wgsl_const(wgsl_file(f"quant_{fmt}"), "GROUP", 0)


def repacked_source(fmt: str, T: int) -> str:
    """The fast driver for a matmul of T tokens on repacked weights: matvec for decode, tiled for
    prefill. It reads no GGUF bytes, so only the format's GROUP is composed in."""
    return _repacked_source(fmt, BY_VARIANT["repacked"].driver(T))


def epilogue_source(fmt: str, op: str, T: int = 1) -> str:
    """The decode matvec on repacked weights (or the few-token one, for a batch's step of T tokens), storing
    its rows and `op` (add, glu) of them with the next stage's other input: one dispatch for two stages."""
    return _repacked_source(fmt, BY_VARIANT["repacked"].driver(T), op)


@lru_cache(maxsize=64)
def _repacked_source(fmt: str, driver: str, epilogue: str = "") -> str:
    files = ["repacked", DRIVERS[driver]]
    if driver == "tiled":  # the 16-token x 8-row tile it shares with the blocks drivers
        files[1:1] = ["quad_step16", "tile16"]
    if driver in ("matvec", "matvec4"):  # how it stores its rows: plainly, or with the next stage's op
        files += ["matvec_store_epilogue", *EPILOGUES[epilogue]] if epilogue else ["matvec_store"]
    return f"const GROUP: u32 = {group_of(fmt)}u;\n" + compose(*files)


def repacked_kernel(fmt: str, name: str, doc: str, quant: str = "", **kw) -> Kernel:
    """A kernel on repacked weights; `quant` names a variant block reader, which the repack uses."""
    row = BY_VARIANT["repacked"]
    return Kernel(f"matmul_{fmt}", name, doc, lambda shape: _repacked_source(fmt, row.driver(shape.T)),
                  repack=lambda: source(fmt, "repack", quant),
                  epilogue=lambda op: epilogue_source(fmt, op), few_epilogue=lambda op, T: epilogue_source(fmt, op, T),
                  epilogue_tokens=FEW_MAX_T, **kw)  # fmt: skip


def block_texels(fmt: str) -> int:
    """16-byte texels per unit of the blocks layout: a K-quant's block, its bytes rounded up; a
    legacy format's group of 8 blocks, the same bytes by field (blocks_group.wgsl)."""
    if BLOCK_DRIVERS[fmt][1] == "group":
        own = wgsl_file(f"blocks_{fmt}")
        return GROUP_BLOCKS * wgsl_const(own, "QS_TEXELS", 0) + wgsl_const(own, "AUX_TEXELS", 0)
    return -(-wgsl_const(wgsl_file(f"quant_{fmt}"), "BLOCK_BYTES", 0) // 16)


# the geometry file each blocks driver is composed after: where a thread's rows and X come from
BLOCK_GEOMETRY = {"tiled": ("quad_step16", "tile16"), "matvec": ("quad_rows",), "splitk": ("splitk_rows",)}


@lru_cache(maxsize=64)
def blocks_source(fmt: str, driver: str, epilogue: str = "") -> str:
    """A driver on the blocks layout: the texture reader, its geometry, the format's own driver
    (after the arithmetic its decode drivers share), its store."""
    before, family = BLOCK_DRIVERS[fmt]
    dot = ["byte_place", f"blocks_{family}_dot"] if driver != "tiled" and fmt in SPLITK_FORMATS else []
    files = ["repacked", "lanes8", "blocks_quads", *BLOCK_GEOMETRY[driver], *before, *dot, f"blocks_{family}_{driver}"]
    if driver != "tiled":
        files += ["matvec_store_epilogue", *EPILOGUES[epilogue]] if epilogue else ["matvec_store"]
    return compose(*files)


@lru_cache(maxsize=16)
def blocks_repack_source(fmt: str) -> str:
    """The blocks layout's source: the format's reader (QK, BLOCK_BYTES) and the copy kernel; for the
    grouped legacy formats only the layout's constants (written from the host, never on the GPU)."""
    if BLOCK_DRIVERS[fmt][1] == "group":  # no GPU kernel: the host groups the fields (repack.group_by_field)
        head = f"const BLOCK_TEXELS: u32 = {block_texels(fmt)}u;\nconst BLOCKS_PER_UNIT: u32 = {GROUP_BLOCKS}u;\n"
        return head + compose("common", f"quant_{fmt}", "blocks_quads")
    return f"const BLOCK_TEXELS: u32 = {block_texels(fmt)}u;\n" + source(fmt, "blocks_repack")


def table_kernel(fmt: str, row: MatmulKernel, prefer: str | None) -> Kernel:
    """A table row's kernel for one format: its source per token count, and for the repacked and
    blocks layouts the repack that writes the weight and the decode driver's fused epilogues."""
    fam = f"matmul_{fmt}"
    if row.layout == "repacked":
        return repacked_kernel(fmt, row.variant, row.doc, prefer=prefer)
    if row.layout == "blocks":
        return Kernel(fam, row.variant, row.doc, lambda shape: blocks_source(fmt, row.driver(shape.T)),
                      repack=lambda: blocks_repack_source(fmt),
                      epilogue=lambda op: blocks_source(fmt, row.short, op), prefer=prefer)  # fmt: skip
    return Kernel(fam, row.variant, row.doc, lambda shape: source(fmt, row.driver(shape.T)), prefer=prefer)


# faulty block readers (quant_<fmt>_<name>.wgsl: a whole reader, or a part's replacement), each
# modeled on a real dequantization bug; they live in the reader, so the weight is repacked with its fault
FAULTY_READERS = (
    ("q4_k", "mins_added", "Q4_K mins added instead of subtracted: negative weights come out positive (001/000)"),
    ("q3_k", "hmask_inverted", "Q3_K's high-bit mask with its meaning inverted: a SET bit subtracts 4, where ggml's "
     "'(hm & m) ? 0 : 4' subtracts it for a clear one. Q3_K's mask is where readers go wrong: paiml/aprender#2115 "
     "read it (and the 2-bit quants) in a flat order, 252 of 256 values wrong, on every Q3_K_S/M file"),
    ("iq2_xxs", "signs_ignored", "IQ2_XXS's sign codes ignored: every value takes |grid|, all positive. I-quant "
     "signs are the fragile part: ikawrakow/ik_llama.cpp#2224 applied IQ3_XXS's signs with a 32-bit add where "
     "8-bit was meant (gibberish); ggml-org/llama.cpp#6012 fixed undefined behaviour building IQ2_S/IQ3_S signs"),
    ("tq2_0", "no_offset", "TQ2_0's ternary digits 0..2 used as they are, not shifted to -1..1 (d·t, not d·(t-1)). "
     "chrishayuk/larql#156 read BitNet's 2-bit ternary codes without 'value = code - 1'"),
    ("mxfp4", "e8m0_full", "MXFP4's E8M0 scale read as 2^(e-127) with ggml's doubled E2M1 table: every value twice "
     "its size (ggml's e8m0_to_fp32_half halves it). tinygrad/tinygrad#14849: the doubled table was missed, which "
     "broke MXFP4 GGUF models; vllm-project/vllm#35979: an MXFP4 scale exponent offset twice, weights 4x too small"),
)  # fmt: skip


def _kernels() -> tuple[Kernel, ...]:
    """Each format's rows of the table as kernels, `prefer` marking what `default_kernel` gives on
    each adapter kind (so the registry's "default" is the table's), then the faulty readers."""
    out = []
    for f in FORMATS_LIST:
        defaults = {default_kernel(f.name, kind)[0]: kind for kind in ("gpu", "cpu")}
        out += [table_kernel(f.name, row, defaults.get(row.variant)) for row in kernels_of(f.name)]
    out += [repacked_kernel(fmt, name, doc, quant=name, faulty=True) for fmt, name, doc in FAULTY_READERS]
    return tuple(out)


def default_variant(family: str, adapter: str, weight_layout: str) -> tuple[str, str]:
    """The Op's hook for kernel selection: the table's default for a `matmul_<fmt>` family."""
    return default_kernel(family.removeprefix("matmul_"), adapter, weight_layout)


OP = Op(
    output=lambda st, s: (s.T, st.params["out"]),
    name="matmul",
    what="a linear layer: each output feature is a weighted sum of the input features",
    formula="y[t, n] = Σ_k x[t, k] · W[n, k]  (+ b[n])",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=_kernels(),
    policies=(
        Policy("lm_head", "default", "every row window of the output matmul is dispatched", every_stage=False),
        Policy(
            "lm_head",
            "skip_last_window",
            "the last row window of the output matmul is never dispatched: those logits keep whatever the "
            "buffer held (002)",
            faulty=True,
            window_filter=lambda index, count: index < count - 1,
            every_stage=False,
        ),
    ),
    family=family,
    default_variant=default_variant,
    weight="matrix",
    chunked_output=True,
    step_fields=("y_offset",),  # the KV writers' (v, and its bias) position in the cache
)
