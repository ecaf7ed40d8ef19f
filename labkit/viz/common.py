"""What the static (matplotlib) and interactive (plotly) figures share: titles, the token labels,
a histogram that does not let outliers stretch it, and the layers × stage-kinds grid of a comparison
(total error) or an attribution (each stage's own error)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from labkit.attribution import Attribution
from labkit.captures import KIND_ORDER, TOP_LEVEL_KINDS, Run, as_f64, graph_position, stage_kind
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


def router_probabilities(run: Run, layer: int) -> tuple[np.ndarray, str]:
    """A layer's router probabilities [token, expert] and what they are: the probabilities stage, or
    (gpt-oss, whose top k are the logits') the softmax of the router's logits over all experts."""
    name = f"blk.{layer}.ffn_router_probs"
    if name in run.captures:
        return as_f64(run[name]), "probabilities"
    z = as_f64(run[f"blk.{layer}.ffn_router"])
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), "softmax of the logits"


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
    """A comparison (total error) or an attribution (each stage's own error) laid out as rows
    (`embed`, layer 0 … N-1, `out`) × stage kinds in pass order.

    `nmse`/`threshold` are NaN where a row has no such stage; `names[r][c]` is the stage or "",
    `hover[r][c]` what a pointer over the cell reads; `first` the first failing (guilty) cell."""

    rows: list[str]
    kinds: list[str]
    nmse: np.ndarray
    threshold: np.ndarray
    passed: np.ndarray  # bool; True where there is no stage
    names: list[list[str]]
    first: tuple[int, int] | None  # (row, column) of the first divergence (or guilty stage)
    hover: list[list[str]] = field(default_factory=list)
    title: str = ""
    local: bool = False  # an attribution's local errors, not a comparison's totals


@dataclass(frozen=True)
class _Cell:
    stage: str
    value: float
    limit: float
    ok: bool
    hover: str


def divergence_grid(x: Comparison | Attribution) -> DivergenceGrid:
    """The grid of a Comparison (total NMSE against its thresholds) or of an Attribution (local NMSE
    against k × band; a segment sits in its captured stage's cell)."""
    if isinstance(x, Attribution):
        cells = [_Cell(r.stage, r.local, r.limit, not r.guilty, _local_hover(r)) for r in x.rows]
        title = f"first guilty: {x.first_guilty} · {x.model} · {x.engine} ({variants_text(x.variants)}), local error"
    else:
        cells = [_Cell(r.stage, r.nmse, r.threshold, r.passed, _total_hover(r)) for r in x.rows]
        title = comparison_title(x, f"first divergence: {x.first_divergence}")
    return _grid(cells, title, isinstance(x, Attribution))


def _total_hover(r) -> str:
    return f"{r.stage}<br>NMSE {r.nmse:.3g}<br>threshold {r.threshold:.3g}<br>{'ok' if r.passed else 'FAIL'}"


def _local_hover(r) -> str:
    return (f"{r.name}<br>local {r.local:.3g} (limit {r.limit:.3g})<br>band {r.band:.3g}<br>"
            f"inherited {r.inherited:.3g}<br>total {r.total:.3g}<br>{'GUILTY' if r.guilty else 'ok'}")  # fmt: skip


def _grid(cells: list[_Cell], title: str, local: bool) -> DivergenceGrid:
    kinds = sorted({stage_kind(c.stage) for c in cells}, key=lambda k: KIND_ORDER.index(k))
    layers = sorted({graph_position(c.stage)[1] for c in cells if c.stage.startswith("blk.")})
    rows = ["embed"] * any(c.stage == "embed" for c in cells) + [f"layer {L}" for L in layers]
    if any(stage_kind(c.stage) in TOP_LEVEL_KINDS[1:] for c in cells):
        rows.append("out")
    shape = (len(rows), len(kinds))
    nmse, thr = np.full(shape, np.nan), np.full(shape, np.nan)
    passed, names = np.ones(shape, bool), [[""] * len(kinds) for _ in rows]
    hover = [[""] * len(kinds) for _ in rows]
    first = None
    for c in cells:
        kind = stage_kind(c.stage)
        row = (
            "embed"
            if kind == "embed"
            else ("out" if kind in TOP_LEVEL_KINDS else f"layer {graph_position(c.stage)[1]}")
        )
        i, j = rows.index(row), kinds.index(kind)
        nmse[i, j], thr[i, j], passed[i, j], names[i][j], hover[i][j] = c.value, c.limit, c.ok, c.stage, c.hover
        if first is None and not c.ok:
            first = (i, j)
    return DivergenceGrid(rows, kinds, nmse, thr, passed, names, first, hover, title, local)


def kernel_times_title(times) -> str:
    """A kernel bench's title: what it times, and on which model and engine (always the GPU)."""
    return f"{times.family} kernels: GPU time of {', '.join(times.kinds)} · {times.model} · gpu"


def paths_title(report, engine: str) -> str:
    """A serving-paths figure's title: what it shows, the model and the engine."""
    return f"serving paths against the one-shot pass · {report.model} · {engine}"


def paths_grid(report, engine: str) -> tuple[list[str], list[str], list[list[float]], list[list[str]]]:
    """(paths, stages, log10 NMSE [path, stage], hover text) of one engine's checks; a bitwise-equal
    stage sits at the floor (-20), a stage a path did not capture is empty."""
    checks = [c for c in report.checks if c.engine == engine]
    stages = list(dict.fromkeys(s.stage for c in checks for s in c.stages))
    z, text = [], []
    for c in checks:
        by = {s.stage: s for s in c.stages}
        z.append([None if n not in by else -20.0 if by[n].bitwise else max(-20.0, math.log10(max(by[n].nmse, 1e-20)))
                  for n in stages])  # fmt: skip
        text.append(
            ["" if n not in by else "0 (bitwise equal)" if by[n].bitwise else f"{by[n].nmse:.2e}" for n in stages]
        )
    return [c.path for c in checks], stages, z, text
