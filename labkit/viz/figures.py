"""Matplotlib figures of captures. Pure presentation: every number comes from a Run."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from labkit.captures import Run, Stats, as_f64, is_attention_map
from labkit.compare import Comparison, stage_kind


def histogram(run: Run, stage: str, pos: int | None = -1, bins: int = 80, ax=None, sample: int | None = None):
    """Histogram of one stage's values (at one position). `sample` marks the first n values read
    on their own, the way post-mortem 000's "all positive" 5-value readout was taken."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    v = as_f64(run.at(stage, pos)).ravel()
    v = v[np.isfinite(v)]
    ax.hist(v, bins=bins, color="#4c72b0")
    if sample:
        for x in v[:sample]:
            ax.axvline(x, color="#c44e52", lw=1)
        ax.set_title(f"{stage} pos={pos}: {sample} red lines = first {sample} values; bars = all {v.size}")
    elif v.size:
        ax.set_title(f"{stage} pos={pos}: min {v.min():.3g} max {v.max():.3g}")
    else:
        ax.set_title(f"{stage} pos={pos}: no finite value")
    ax.axvline(0, color="k", lw=0.5)
    return ax


def attention_map(run: Run, layer: int, head: int = 0, probs: bool = True, ax=None, labels: list[str] | None = None):
    """[q_pos, k_pos] attention probabilities (or masked scores) of one head.

    Rows are labeled with their real query positions (a decode step's one row is position
    n_past, not 0), and with token pieces where the run knows them: `labels` (one per key
    position), else the run's own tokens when they are all the keys (a prompt pass)."""
    ax = ax or plt.subplots(figsize=(4, 4))[1]
    name = f"blk.{layer}.attn_probs" if probs else f"blk.{layer}.attn_scores"
    m = run[name][head]
    m = np.where(np.isfinite(m), m, np.nan)
    im = ax.imshow(m, cmap="viridis", interpolation="nearest", aspect="auto")
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(f"{name} head {head}")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    q_pos = [run.n_past + p for p in run.rows(name)]
    keys = labels
    if keys is None and run.piece is not None and run.n_past == 0 and len(run.tokens) == m.shape[1]:
        keys = [run.piece(t) for t in run.tokens]
    named = keys is not None and len(keys) == m.shape[1]
    if m.shape[1] <= 64:
        ax.set_xticks(range(m.shape[1]), [f"{k} {keys[k]!r}" if named else str(k) for k in range(m.shape[1])],
                      rotation=90, fontsize=7)  # fmt: skip
    if len(q_pos) <= 64:
        ax.set_yticks(range(len(q_pos)), [f"{p} {keys[p]!r}" if named else str(p) for p in q_pos], fontsize=7)
    return ax


def layer_trajectory(run: Run, n_layers: int, positions: tuple[int, ...] = (0, -1), kind: str = "resid_out", ax=None):
    """min/max of a per-layer stage at chosen positions: post-mortem 000's method."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for pos in positions:
        lo = [run.stats(f"blk.{L}.{kind}", pos=pos).min for L in range(n_layers)]
        hi = [run.stats(f"blk.{L}.{kind}", pos=pos).max for L in range(n_layers)]
        line = ax.plot(hi, label=f"max pos={pos}")[0]
        ax.plot(lo, ls="--", color=line.get_color(), label=f"min pos={pos}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_title(f"{kind} range per layer")
    ax.legend(fontsize=7)
    return ax


def logit_ranking(run: Run, k: int = 10, pos: int = -1, ax=None):
    """Bar chart of the top-k next tokens with their probabilities."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    top = run.top(k, pos=pos)
    ax.barh([repr(t.piece) for t in top][::-1], [t.prob for t in top][::-1], color="#55a868")
    ax.set_xlabel("probability")
    ax.set_title(f"top-{k} at position {pos}")
    return ax


def divergence(cmp: Comparison, ax=None):
    """NMSE per stage on a log scale, thresholds dashed, failures red."""
    ax = ax or plt.subplots(figsize=(9, 3))[1]
    nm = np.array([max(r.nmse, 1e-20) for r in cmp.rows])
    colors = ["#c44e52" if not r.passed else "#4c72b0" for r in cmp.rows]
    ax.scatter(range(len(nm)), nm, c=colors, s=8)
    ax.plot([r.threshold for r in cmp.rows], ls="--", color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("stage index")
    ax.set_ylabel("NMSE")
    ax.set_title(f"{cmp.a_engine} vs {cmp.b_engine}: first divergence {cmp.first_divergence}")
    return ax


def attention_grid(run: Run, layer: int, probs: bool = True, labels: list[str] | None = None, fig=None):
    """Every head's [q_pos, k_pos] map of one layer side by side, on a shared color scale."""
    from matplotlib.figure import Figure

    name = f"blk.{layer}.attn_probs" if probs else f"blk.{layer}.attn_scores"
    a = run[name]
    heads = list(range(a.shape[0]))
    cols = min(len(heads), 6)
    rows = -(-len(heads) // cols)
    fig = fig or Figure(figsize=(2.3 * cols + 0.8, 2.3 * rows + 0.4))
    axs = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    finite = a[np.isfinite(a)]
    lo, hi = (0.0, 1.0) if probs else ((float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0))
    im = None
    for ax, h in zip(axs, heads):
        m = np.where(np.isfinite(a[h]), a[h], np.nan)
        im = ax.imshow(m, cmap="viridis", interpolation="nearest", vmin=lo, vmax=hi)
        ax.set_title(f"head {h}", fontsize=8)
        ticks = range(m.shape[1])
        if labels and len(labels) == m.shape[1] and m.shape[1] <= 32:
            ax.set_xticks(ticks, labels, rotation=90, fontsize=6)
            ax.set_yticks(range(m.shape[0]), labels[-m.shape[0] :], fontsize=6)
        else:
            ax.tick_params(labelsize=6)
    for ax in axs[len(heads) :]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=list(axs[: len(heads)]), fraction=0.02)
    fig.suptitle(f"{name}: rows = query, columns = key", fontsize=9)
    return fig


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


def _histogram(v: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Counts over the finite values; when a few outliers stretch the range more than 10× beyond
    the central 99%, over that central range instead, with the outliers counted on either side."""
    if not v.size:
        return np.zeros(bins, int), np.linspace(0, 1, bins + 1), (0, 0)
    lo, hi = float(v.min()), float(v.max())
    p_lo, p_hi = (float(q) for q in np.percentile(v, [0.5, 99.5]))
    if p_hi > p_lo and hi - lo > 10 * (p_hi - p_lo):
        lo, hi = p_lo, p_hi
    hist, edges = np.histogram(v, bins=bins, range=(lo, hi) if hi > lo else None)
    return hist, edges, (int(np.count_nonzero(v < edges[0])), int(np.count_nonzero(v > edges[-1])))


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


def show(run: Run, stage: str, pos: int | None = None) -> None:
    """Display `array_summary(run, stage, pos)` in the notebook."""
    from IPython.display import display

    display(array_summary(run, stage, pos))
