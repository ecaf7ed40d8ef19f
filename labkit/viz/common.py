"""What the static (matplotlib) and interactive (plotly) figures share: titles, the token labels,
a histogram that does not let outliers stretch it, and the layers × stage-kinds grid of a comparison."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from labkit.captures import KIND_ORDER, TOP_LEVEL_KINDS, Run, graph_position, stage_kind
from labkit.compare import Comparison


def variants_text(variants: Mapping[str, str]) -> str:
    """`rope=normal_pairs, lm_head=skip_last_window`, or `default kernels`."""
    chosen = {k: v for k, v in variants.items() if v != "default"}
    return ", ".join(f"{k}={v}" for k, v in sorted(chosen.items())) or "default kernels"


def run_title(run: Run, what: str) -> str:
    """`what · model · engine · variants`: every figure says which run it shows."""
    return f"{what} · {run.model} · {run.engine} · {variants_text(run.variants)}"


def lens_title(lens, what: str) -> str:
    """The same for a logit lens (labkit.lens.LogitLens), which keeps its run's labels."""
    return f"{what} · {lens.model} · {lens.engine} · {variants_text(lens.variants)}"


def comparison_title(cmp: Comparison, what: str) -> str:
    a = f"{cmp.a_engine} ({variants_text(cmp.a_variants)})"
    b = f"{cmp.b_engine} ({variants_text(cmp.b_variants)})"
    return f"{what} · {cmp.model} · {a} vs {b}"


def token_labels(run: Run, n: int | None = None) -> list[str] | None:
    """`3 ' sky'` for each position of a prompt pass, when the run knows its tokens' text."""
    if run.piece is None or run.n_past != 0 or (n is not None and n != len(run.tokens)):
        return None
    return [f"{i} {run.piece(int(t))!r}" for i, t in enumerate(run.tokens)]


def robust_histogram(v: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Counts over the finite values; when a few outliers stretch the range more than 10× beyond
    the central 99%, over that range widened by half its width instead (the tails stay), with the
    outliers beyond it counted on either side."""
    if not v.size:
        return np.zeros(bins, int), np.linspace(0, 1, bins + 1), (0, 0)
    lo, hi = float(v.min()), float(v.max())
    p_lo, p_hi = (float(q) for q in np.percentile(v, [0.5, 99.5]))
    spread = p_hi - p_lo
    if spread > 0 and hi - lo > 10 * spread:  # keep the tails, drop what lies far beyond them
        lo, hi = max(lo, p_lo - spread / 2), min(hi, p_hi + spread / 2)
    hist, edges = np.histogram(v, bins=bins, range=(lo, hi) if hi > lo else None)
    return hist, edges, (int(np.count_nonzero(v < edges[0])), int(np.count_nonzero(v > edges[-1])))


@dataclass
class DivergenceGrid:
    """A comparison laid out as rows (`embed`, layer 0 … N-1, `out`) × stage kinds in pass order.

    `nmse`/`threshold` are NaN where a row has no such stage; `names[r][c]` is the stage or ""."""

    rows: list[str]
    kinds: list[str]
    nmse: np.ndarray
    threshold: np.ndarray
    passed: np.ndarray  # bool; True where there is no stage
    names: list[list[str]]
    first: tuple[int, int] | None  # (row, column) of the first divergence


def divergence_grid(cmp: Comparison) -> DivergenceGrid:
    kinds = sorted({stage_kind(r.stage) for r in cmp.rows}, key=lambda k: KIND_ORDER.index(k))
    layers = sorted({graph_position(r.stage)[1] for r in cmp.rows if r.stage.startswith("blk.")})
    rows = ["embed"] * any(r.stage == "embed" for r in cmp.rows) + [f"layer {L}" for L in layers]
    if any(stage_kind(r.stage) in TOP_LEVEL_KINDS[1:] for r in cmp.rows):
        rows.append("out")
    shape = (len(rows), len(kinds))
    nmse, thr = np.full(shape, np.nan), np.full(shape, np.nan)
    passed, names = np.ones(shape, bool), [[""] * len(kinds) for _ in rows]
    first = None
    for r in cmp.rows:
        kind = stage_kind(r.stage)
        row = (
            "embed"
            if kind == "embed"
            else ("out" if kind in TOP_LEVEL_KINDS else f"layer {graph_position(r.stage)[1]}")
        )
        i, j = rows.index(row), kinds.index(kind)
        nmse[i, j], thr[i, j], passed[i, j], names[i][j] = r.nmse, r.threshold, r.passed, r.stage
        if first is None and not r.passed:
            first = (i, j)
    return DivergenceGrid(rows, kinds, nmse, thr, passed, names, first)
