"""kv_cache: a layer's new K or V rows written into a cache of a smaller type, and read back as attention reads them.

llama.cpp keeps its cache in the type `--cache-type-k/-v` names (f16 by default, q8_0 or q4_0 to halve or
quarter it), and its attention reads the rounded values. `labkit.open(m, kv_type=...)` gives every cache
writer a stage after it (`blk.L.k_cache`, `blk.L.v_cache`, labkit.model.cache_stages): its value is the
new rows as the cache holds them (labkit.quant.cache_types.round_trip on the reference), so a fault in the
cache's write shows at that stage, and both engines attend over the same rounded rows.

On the GPU the cache holds the type's blocks, each row padded to a whole word. One kernel per type does
both directions: mode 0 (this stage) quantizes the pass's rows into the cache at n_past and reads them
back into the stage's region; mode 1 (`load`, dispatched by each stage that reads the cache) reads every
cached row into a view the attention kernels read as f32. The reader is the matmul's for that format
(quant_<type>.wgsl); the writer is ggml's `quantize_row_<type>_ref`, bit for bit."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose, wgsl_const
from labkit.quant.cache_types import KV_TYPES, round_trip, row_bytes

PARAMS = Params(mode="u32", row0="u32", rows="u32", width="u32", row_words="u32", x_offset="u32", y_offset="u32")
STORED = tuple(t for t in KV_TYPES if t != "f32")  # f32 needs no stage: the writer writes the cache itself
# A load's workgroup count, whatever the rows (its threads stride over them), so a compiled step keeps one count.
# On lavapipe (AMD EPYC family 26, SmolLM2 decode of 32 tokens on a q8_0 cache, median of 3, f32 cache beside):
# 256 workgroups ran at 0.52x the f32 cache's tok/s, 32 at 0.71x, 8 at 0.78x; 32 leaves a real GPU some width.
LOAD_WORKGROUPS = 32


def row_words(t: str, width: int) -> int:
    """u32 words of one GPU cache row: its blocks, padded to a word."""
    return ceil_div(row_bytes(t, width), 4)


def reference(stage, ref) -> np.ndarray:
    return round_trip(ref.x[0], stage.params["type"])


def workgroups(t: str, rows: int, width: int) -> int:
    """A store's: one thread per group of BLOCKS blocks of QK values (the writer's and the reader's constants:
    blocks that fill whole words)."""
    src = source(t)
    qk, blocks = wgsl_const(src, "QK", 32), wgsl_const(src, "BLOCKS", 1)
    return ceil_div(rows * ceil_div(width // qk, blocks), 64)


def plan(stage, gpu):
    P, x = stage.params, gpu.input(0)
    t, w = P["type"], P["width"]
    out = gpu.output((gpu.T, w))  # the rows as the cache holds them (not the cache: labkit.gpu.stage_context)
    values = {"mode": 0, "row0": gpu.n_past, "rows": gpu.T, "width": w, "row_words": row_words(t, w),
              "x_offset": x.offset, "y_offset": out.offset}  # fmt: skip
    gpu.dispatch([x.buffer, gpu.cache(stage.kv_write), out.buffer], values, workgroups(t, gpu.T, w))
    return out


def load_values(t: str, rows: int, width: int) -> dict:
    """A load's Params: the cache's first `rows` rows into a view from its start."""
    return {"mode": 1, "row0": 0, "rows": rows, "width": width, "row_words": row_words(t, width), "x_offset": 0,
            "y_offset": 0}  # fmt: skip


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    return [f"[T, {P['width']}] f32"], f"[T, {P['width']}] as a {P['type']} cache holds it"


def source(t: str, writer: str = "") -> str:
    """common + the type's reader (the matmul's) + its writer (or a fault's) + the store/load driver."""
    from labkit.ops.matmul import READER_PARTS

    reader = [f"quant_{t}", *([f"quant_{t}_{READER_PARTS[t]}"] if t in READER_PARTS else [])]
    tables = ["quant_tables"] if t == "iq4_nl" else []
    return compose("common", *tables, *reader, writer or f"kv_quant_{t}", "kv_cache")


def _kernel(t: str) -> Kernel:
    return Kernel(f"kv_cache_{t}", "default", f"ggml's {t} cache write, bit for bit", lambda shape: source(t))


FAULTS = (
    Kernel("kv_cache_q8_0", "scale_per_64", "FAULT: one scale over two blocks of 32 (cf. llama.cpp #23044)",
           lambda shape: source("q8_0", "kv_quant_q8_0_scale_per_64"), faulty=True),
)  # fmt: skip

OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="kv_cache",
    what="writes the new K or V rows into the cache in its type and reads them back as the attention will",
    formula="y[t] = dequantize(quantize(x[t]))  (the cache's type; ggml's quantize_row_<type>_ref)",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    family=lambda stage, tensor_type: f"kv_cache_{stage.params['type']}",
    step_fields=("row0", "rows"),  # a store's first row (n_past); a load's rows (n_past + 1)
    kernels=(*(_kernel(t) for t in STORED), *FAULTS),
)
