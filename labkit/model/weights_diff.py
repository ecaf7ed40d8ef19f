"""Two GGUF files, tensor by tensor: "verify the model conversion" (post-mortem 000).

Both files are memory-mapped and walked a chunk of rows at a time, so memory stays bounded
whatever their size. Rows whose bytes are equal are equal values, so a tensor is only
dequantized (with gguf.quants) where its bytes differ somewhere; then its NMSE covers every
value. Tensors are listed in the order the model's graph first reads them, so the first
differing tensor is the first place a run of the two files can part.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit import progress
from labkit.errors import LabkitError
from labkit.model.dequant import dequantize_rows, row_table
from labkit.model.gguf_file import GgufFile, TensorInfo, open_gguf

_CHUNK_BYTES = 4 << 20  # bytes of one file's rows per step: bounds the float64 temporaries


@dataclass(frozen=True)
class TensorDiff:
    """One tensor of A against B. status: identical, differs, type, shape, missing (only in A), extra (only in B)."""

    name: str
    status: str
    type_a: str | None = None
    type_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    nmse: float | None = None  # Σ(a−b)²/Σb² over the dequantized values (0 when identical)
    max_abs: float | None = None
    blocks_differing: int = 0  # quant blocks whose bytes differ (same type and shape only)
    first_row: int | None = None  # the first row whose bytes differ


@dataclass
class WeightsDiff:
    a: str
    b: str
    tensors: list[TensorDiff]
    metadata_differing: list[str] = field(default_factory=list)  # metadata keys whose values differ

    @property
    def identical(self) -> bool:
        return not self.metadata_differing and all(t.status == "identical" for t in self.tensors)

    @property
    def differing(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.status != "identical"]

    @property
    def first_difference(self) -> str | None:
        """The first differing tensor in graph order."""
        return self.differing[0].name if self.differing else None

    def table(self) -> str:
        # file names, not paths: a notebook's saved table shows no one's local folders (a and b keep them)
        lines = [f"{Path(self.a).name} vs {Path(self.b).name}: {len(self.tensors)} tensors"]
        if self.identical:
            return lines[0] + "\nidentical: every tensor's bytes and every metadata value are the same"
        lines.append(f"first differing tensor (graph order): {self.first_difference}")
        for t in self.differing:
            lines.append("  " + _describe(t))
        if self.metadata_differing:
            lines.append("metadata differing: " + ", ".join(self.metadata_differing))
        lines.append(f"{len(self.tensors) - len(self.differing)} tensors identical")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "first_difference": self.first_difference,
            "metadata_differing": self.metadata_differing,
            "tensors": [asdict(t) for t in self.tensors],
        }


def _describe(t: TensorDiff) -> str:
    if t.status == "missing":
        return f"{t.name}: only in A"
    if t.status == "extra":
        return f"{t.name}: only in B"
    if t.status == "shape":
        return f"{t.name}: shape {list(t.shape_a)} vs {list(t.shape_b)}"
    kind = f"type {t.type_a} vs {t.type_b}, " if t.status == "type" else ""
    blocks = f"{t.blocks_differing} blocks differ from row {t.first_row}, " if t.status == "differs" else ""
    return f"{t.name}: {kind}{blocks}nmse {t.nmse:.3e}, max |a-b| {t.max_abs:.3g}"


def diff_weights(path_a: str | Path, path_b: str | Path) -> WeightsDiff:
    """Compare two GGUF files tensor by tensor (and their metadata). Neither file is written."""
    a, b = open_gguf(path_a), open_gguf(path_b)
    rows = []
    for name in progress.track(_graph_order(a, b), "diff-weights", unit="tensor"):
        rows.append(_diff_tensor(a, b, name))
        for f in (a, b):  # drop the pages just read: resident memory stays about one tensor's worth
            if name in f.tensors:
                f.release(name)
    return WeightsDiff(str(path_a), str(path_b), rows, _metadata_differing(a, b))


def _graph_order(a: GgufFile, b: GgufFile) -> list[str]:
    """Tensor names in the order file A's graph reads them, then the rest in file order."""
    order: list[str] = []
    try:
        from labkit.model.config import config_from_metadata
        from labkit.model.graph import build_graph

        graph = build_graph(config_from_metadata(a.metadata, set(a.tensors)))
        order = [n for st in graph for n in (st.weight, st.bias) if n]
    except LabkitError:  # an architecture labkit cannot build: file order
        pass
    names = [*order, *a.tensors, *b.tensors]
    return [n for n in dict.fromkeys(names) if n in a.tensors or n in b.tensors]


def _metadata_differing(a: GgufFile, b: GgufFile) -> list[str]:
    keys = dict.fromkeys([*a.metadata, *b.metadata])
    return [k for k in keys if not _same_value(a.metadata.get(k), b.metadata.get(k))]


def _same_value(x, y) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)
    return x == y


def _diff_tensor(a: GgufFile, b: GgufFile, name: str) -> TensorDiff:
    ta, tb = a.tensors.get(name), b.tensors.get(name)
    if tb is None:
        return TensorDiff(name, "missing", ta.type_name, None, ta.shape)
    if ta is None:
        return TensorDiff(name, "extra", None, tb.type_name, None, tb.shape)
    base = {"type_a": ta.type_name, "type_b": tb.type_name, "shape_a": ta.shape, "shape_b": tb.shape}
    if ta.shape != tb.shape:
        return TensorDiff(name, "shape", **base)
    if ta.ggml_type != tb.ggml_type:
        nmse, max_abs, _, _ = _values(a, b, ta, tb, same_bytes=False)
        return TensorDiff(name, "type", **base, nmse=nmse, max_abs=max_abs)
    nmse, max_abs, blocks, first = _values(a, b, ta, tb, same_bytes=True)
    return TensorDiff(name, "differs" if blocks else "identical", **base, nmse=nmse, max_abs=max_abs,
                      blocks_differing=blocks, first_row=first)  # fmt: skip


def _values(a: GgufFile, b: GgufFile, ta: TensorInfo, tb: TensorInfo, same_bytes: bool):
    """(nmse, max |a-b|, differing blocks, first differing row), a chunk of rows at a time.
    With the same type, equal bytes are equal values; only a tensor with a difference is decoded."""
    n_cols = ta.n_cols
    ra, rb = row_table(a.raw(ta.name), ta.ggml_type, n_cols), row_table(b.raw(tb.name), tb.ggml_type, n_cols)
    step = max(1, _CHUNK_BYTES // max(ra.shape[1], rb.shape[1], 1))
    blocks, first = 0, None
    if same_bytes:
        block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ta.ggml_type)][1]
        for r0 in range(0, ra.shape[0], step):
            ca, cb = np.asarray(ra[r0 : r0 + step]), np.asarray(rb[r0 : r0 + step])
            if np.array_equal(ca, cb):
                continue
            neq = (ca.reshape(ca.shape[0], -1, block_bytes) != cb.reshape(cb.shape[0], -1, block_bytes)).any(axis=2)
            blocks += int(neq.sum())
            first = r0 + int(np.flatnonzero(neq.any(axis=1))[0]) if first is None else first
        if not blocks:
            return 0.0, 0.0, 0, None
    num = den = max_abs = 0.0
    for r0 in range(0, ra.shape[0], step):
        rows = slice(r0, r0 + step)
        va = dequantize_rows(a.raw(ta.name), ta.ggml_type, n_cols, rows).astype(np.float64)
        vb = dequantize_rows(b.raw(tb.name), tb.ggml_type, n_cols, rows).astype(np.float64)
        d = va - vb
        num, den = num + float(np.sum(d * d)), den + float(np.sum(vb * vb))
        max_abs = max(max_abs, float(np.max(np.abs(d))) if d.size else 0.0)
    return (num / den if den > 0 else num), max_abs, blocks, first
