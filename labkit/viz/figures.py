"""Figures of captures, in one namespace. Pure presentation: every number comes from a Run.

Interactive (plotly, return a go.Figure): attention_map, divergence, histogram, kernel_times,
logit_lens, paths_map, tracked_tokens. Static (matplotlib, take `ax=`/`fig=`, return it):
logit_ranking, layer_trajectory, attention_grid; labkit.viz.static has matplotlib versions of every
figure. `array_summary` and `show` put one capture on a line (stats, histogram, heat map per
position), treescope-like."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.captures import Run, Stats, as_f64, is_attention_map
from labkit.compare import stage_kind
from labkit.errors import LabkitError
from labkit.viz.common import robust_histogram as _histogram
from labkit.viz.interactive import (
    attention_map,
    divergence,
    expert_load,
    histogram,
    kernel_times,
    logit_lens,
    paths_map,
    router_map,
    tracked_tokens,
)
from labkit.viz.static import attention_grid, layer_trajectory, logit_ranking

__all__ = [
    "ArraySummary",
    "array_summary",
    "attention_grid",
    "attention_map",
    "divergence",
    "expert_load",
    "histogram",
    "kernel_times",
    "layer_trajectory",
    "logit_lens",
    "logit_ranking",
    "paths_map",
    "router_map",
    "show",
    "tracked_tokens",
]


# ----- a treescope-like summary of one capture: stats, a histogram sparkline, a heat map per position


@dataclass
class ArraySummary:
    """One capture at a glance (`figures.array_summary(run, stage)`); displays as HTML in Jupyter.

    `image` is a PNG: one row per position (per query row, heads side by side for attention maps),
    columns = values (max-|x| pooled to at most 512 columns, so a NaN or an outlier survives
    pooling); colors: diverging around 0 at ±`vmax` (probabilities: 0..1); NaN magenta (unwritten
    debug poison included), ±inf black, masked attention scores (-inf) light gray."""

    stage: str
    kind: str  # the stage kind (compare.stage_kind): `attn_probs` are drawn on 0..1
    stats: Stats
    dtype: str
    image: bytes
    width: int  # of the image, in pixels
    vmax: float
    hist: np.ndarray
    edges: np.ndarray
    rows: list[str]
    row_rms: list[float]
    row_bad: list[int]
    pooled: int
    outside: tuple[int, int] = (0, 0)  # finite values left and right of the histogram's range

    @property
    def masked(self) -> int:
        """-inf elements of attention scores: the causal/sliding mask, not a fault."""
        return self.stats.masked

    def _repr_html_(self) -> str:
        return _summary_html(self)

    html = property(_repr_html_)  # the same HTML as an attribute (widgets put it in an HTML widget)

    def __repr__(self) -> str:
        return f"ArraySummary({self.stats})"


MAX_COLS = 512
NAN_RGB, INF_RGB, MASK_RGB = (255, 0, 255), (0, 0, 0), (225, 225, 225)


def _pool(a: np.ndarray, cols: int) -> tuple[np.ndarray, int]:
    """[rows, n] → [rows, ≤cols]: each block keeps its value of largest |x|, NaN if it holds one."""
    n = a.shape[1]
    k = max(1, -(-n // cols))
    if k == 1:
        return a, 1
    pad = (-n) % k
    b = np.pad(a, ((0, 0), (0, pad)), constant_values=0.0).reshape(a.shape[0], -1, k)
    idx = np.argmax(np.where(np.isnan(b), np.inf, np.abs(b)), axis=2)
    out = np.take_along_axis(b, idx[..., None], axis=2)[..., 0]
    out[np.isnan(b).any(axis=2)] = np.nan
    return out, k


def _rgba(m: np.ndarray, vmax: float, probs: bool, masked_neg_inf: bool) -> np.ndarray:
    import matplotlib

    cmap = matplotlib.colormaps["viridis" if probs else "RdBu_r"]
    with np.errstate(invalid="ignore"):
        x = np.clip(m / vmax, 0, 1) if probs else np.clip(0.5 + 0.5 * m / vmax, 0, 1)
    rgb = (cmap(np.nan_to_num(x, nan=0.5))[..., :3] * 255).astype(np.uint8)
    rgb[np.isnan(m)] = NAN_RGB
    rgb[np.isinf(m)] = INF_RGB
    if masked_neg_inf:
        rgb[np.isneginf(m)] = MASK_RGB
    return rgb


def _png(rgb: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def array_summary(run: Run, stage: str, pos: int | None = None, bins: int = 40) -> ArraySummary:
    """Shape, dtype, min/max/mean/std/rms, NaN/inf/unwritten counts, a histogram sparkline and a
    heat map with one row per position (see ArraySummary), for one capture or one position of it."""
    a = run.at(stage, pos)
    st = run.stats(stage, pos=pos)
    kind = stage_kind(stage)
    attn, probs = is_attention_map(stage), kind == "attn_probs"
    piece = run.piece or str
    labels = [repr(piece(int(t))) for t in run.tokens]
    first = run.n_past
    # The heat map is pooled in float32 (no copy of a GPU capture) and only the pooled pixels go to
    # float64; the numbers (rows, histogram) come from the capture as it is. The debug poison is a
    # signalling NaN: any comparison or arithmetic on it raises the invalid flag.
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.asarray(a).reshape(1, 1) if np.ndim(a) == 0 else np.asarray(a)
        x = a.astype(np.float32, copy=False)
        if attn and a.ndim == 3:  # [heads, q, k]: rows = query positions, one block per head
            blocks = list(x)
            by_row = a.transpose(1, 0, 2).reshape(a.shape[1], -1)
            rows = [f"q {first + i} {labels[i]}" if i < len(labels) else f"q {i}" for i in range(a.shape[1])]
        elif attn and a.ndim == 2:  # one query row: [heads, k]
            blocks, by_row = [x], a
            rows = [f"head {i}" for i in range(a.shape[0])]
        elif pos is None and a.ndim >= 2:
            blocks, by_row = [x.reshape(a.shape[0], -1)], a.reshape(a.shape[0], -1)
            rows = [f"{first + i} {labels[i]}" if i < len(labels) else str(i) for i in range(a.shape[0])]
        else:
            blocks, by_row = [x.reshape(1, -1)], a.reshape(1, -1)
            rows = [f"pos {pos}"] if pos is not None else [stage]
        finite = as_f64(by_row[np.isfinite(by_row)])
        vmax = 1.0 if probs else (float(np.percentile(np.abs(finite), 99)) if finite.size else 1.0) or 1.0
        parts, k = [], 1
        for i, b in enumerate(blocks):
            pooled, k = _pool(b, max(8, MAX_COLS // len(blocks)))
            if i:
                parts.append(np.full((b.shape[0], 1, 3), 255, np.uint8))  # a white gap between heads
            parts.append(_rgba(as_f64(pooled), vmax, probs, masked_neg_inf=attn))
        rgb = np.concatenate(parts, axis=1)
        row_rms, row_bad = _row_stats(by_row, masked_neg_inf=attn)
    hist, edges, outside = _histogram(finite, bins)
    return ArraySummary(
        stage=st.stage,
        kind=kind,
        stats=st,
        dtype=str(a.dtype),
        image=_png(rgb),
        width=rgb.shape[1],
        vmax=vmax,
        hist=hist,
        edges=edges,
        rows=rows,
        row_rms=row_rms,
        row_bad=row_bad,
        pooled=k,
        outside=outside,
    )


def _row_stats(x: np.ndarray, masked_neg_inf: bool) -> tuple[list[float], list[int]]:
    """Per row of [rows, n]: the rms of the finite values (NaN for none), and the NaN and inf count
    (-inf not counted where it is the attention mask)."""
    fin = np.isfinite(x)
    n = np.count_nonzero(fin, axis=-1)
    ss = np.sum(np.square(np.where(fin, x, 0), dtype=np.float64), axis=-1)
    rms = np.sqrt(ss / np.maximum(n, 1))
    rms[n == 0] = np.nan
    bad = np.isnan(x) | np.isposinf(x)
    if not masked_neg_inf:
        bad |= np.isneginf(x)
    return [float(r) for r in rms], [int(c) for c in np.count_nonzero(bad, axis=-1)]


def _sparkline(s: ArraySummary, w: int = 200, h: int = 40) -> str:
    """Inline SVG histogram: bars over the finite values, the zero line red."""
    n = len(s.hist)
    top = max(int(s.hist.max()), 1)
    bw = w / n
    bars = "".join(
        f"<rect x='{i * bw:.1f}' y='{h - c / top * h:.1f}' width='{max(bw - 0.5, 0.5):.1f}' "
        f"height='{c / top * h:.1f}' fill='#4c72b0'/>"
        for i, c in enumerate(s.hist)
        if c
    )
    lo, hi = float(s.edges[0]), float(s.edges[-1])
    left = f"<b title='values below the range'>◀{s.outside[0]}</b> " if s.outside[0] else ""
    right = f" <b title='values above the range'>{s.outside[1]}▶</b>" if s.outside[1] else ""
    zero = ""
    if lo < 0 < hi:
        zx = (0 - lo) / (hi - lo) * w
        zero = f"<line x1='{zx:.1f}' x2='{zx:.1f}' y1='0' y2='{h}' stroke='#c44e52' stroke-width='1'/>"
    return (
        f"<svg width='{w}' height='{h}' style='background:rgba(0,0,0,.03)'>{bars}{zero}</svg>"
        f"<div style='display:flex;justify-content:space-between;width:{w}px;color:#666'>"
        f"<span>{left}{lo:.3g}</span><span>{hi:.3g}{right}</span></div>"
    )


def _summary_html(s: ArraySummary) -> str:
    import base64
    import html

    n_rows = len(s.rows)
    row_h = max(3, min(14, 220 // max(n_rows, 1)))
    img_w = min(MAX_COLS, max(160, s.width))
    font = f"font-size:{min(11, row_h)}px;line-height:{row_h}px;height:{row_h}px;white-space:pre;overflow:hidden"
    show_labels = row_h >= 7
    left = "".join(f"<div style='{font}'>{html.escape(r)}</div>" for r in s.rows) if show_labels else ""
    right = (
        "".join(
            f"<div style='{font};{'color:#c00' if bad else 'color:#666'}'>"
            f"rms {rms:.3g}{f' · {bad} bad' if bad else ''}</div>"
            for rms, bad in zip(s.row_rms, s.row_bad)
        )
        if show_labels
        else ""
    )
    b64 = base64.b64encode(s.image).decode()
    st = s.stats
    bad = "color:#c00;font-weight:bold"
    counts = " ".join(
        f"<span style='{bad if v else ''}'>{k}={v}</span>"
        for k, v in (("nan", st.nan), ("inf", st.inf - st.masked), ("unwritten", st.unwritten))
    )
    if st.masked:
        counts += f" <span style='color:#666'>masked (-inf)={st.masked}</span>"
    pooled = f", max-|x| pooled ×{s.pooled}" if s.pooled > 1 else ""
    scale = "0..1" if s.kind == "attn_probs" else f"±{s.vmax:.3g} (99th pct |x|)"
    return (
        "<div class='labkit-array' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:12px'>"
        f"<div><code><b>{html.escape(s.stage)}</b></code> {s.dtype}[{', '.join(map(str, st.shape))}] · "
        f"min {st.min:.4g} · max {st.max:.4g} · mean {st.mean:.4g} · std {st.std:.4g} · rms {st.rms:.4g} · "
        f"{counts}</div>"
        "<div style='display:flex;gap:10px;align-items:flex-start;margin-top:4px'>"
        f"<div>{_sparkline(s)}</div>"
        f"<div style='text-align:right;font-family:var(--jp-code-font-family,monospace)'>{left}</div>"
        f"<img src='data:image/png;base64,{b64}' style='width:{img_w}px;height:{row_h * n_rows}px;"
        "image-rendering:pixelated;border:1px solid #ccc'/>"
        f"<div style='font-family:var(--jp-code-font-family,monospace)'>{right}</div></div>"
        f"<div style='color:#666'>colors: {scale}{pooled}; magenta NaN/unwritten, black inf, gray masked</div>"
        "</div>"
    )


def explanation_html(run: Run, stage: str) -> str:
    """What `stage` computes (the op's text, from `run.explain`), as HTML; "" when the run has no lab."""
    if run.explain is None:
        return ""
    try:
        return run.explain(stage)._repr_html_()
    except LabkitError:  # a name the graph does not have (an engine's extra dump)
        return ""


def show(run: Run, stage: str, pos: int | None = None) -> None:
    """Display what `stage` computes and `array_summary(run, stage, pos)` in the notebook."""
    from IPython.display import HTML, display

    display(HTML(explanation_html(run, stage) + array_summary(run, stage, pos).html))
