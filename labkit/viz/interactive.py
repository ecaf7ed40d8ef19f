"""Interactive plotly figures of captures: hover shows what a cell is (tokens, stage, NMSE).

Each returns a `plotly.graph_objects.Figure`; pass `fig=` (e.g. from `plotly.subplots.make_subplots`)
with `row=`/`col=` to draw into a figure of your own, or `ax=` to draw the matplotlib version on an Axes
(then the Axes is returned). Every title names the model, the engine and
the kernel variants. The matplotlib versions, for still images and `ax=`, are in labkit.viz.static.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from labkit.attribution import Attribution
from labkit.captures import Run, as_f64
from labkit.compare import Comparison
from labkit.kernel_trial import KernelTimes
from labkit.lens import LogitLens
from labkit.serving_paths import PathsReport
from labkit.viz import static
from labkit.viz.common import (
    divergence_grid,
    kernel_times_title,
    lens_title,
    paths_grid,
    paths_title,
    robust_histogram,
    router_probabilities,
    run_title,
    token_labels,
)

PLOTLY_MIME = "application/vnd.plotly.v1+json"


class LabFigure(go.Figure):
    """A plotly Figure that displays with a still PNG beside its interactive JSON: JupyterLab shows
    the interactive one (hover), and a viewer without plotly (GitHub, nbviewer, a notebook opened
    before its kernel) shows the PNG, drawn by the matplotlib twin in labkit.viz.static."""

    def __init__(self, *args, still=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._still = still  # () -> matplotlib Axes or Figure

    def _mime_bundle(self) -> dict:
        import json

        import plotly.io as pio

        bundle = {PLOTLY_MIME: json.loads(pio.to_json(self, validate=False)), "text/plain": self._title()}
        if self._still is not None:
            bundle["image/png"] = _png(self._still())
        return bundle

    def _title(self) -> str:
        title = self.layout.title.text if self.layout.title else None
        return f"<plotly figure: {title}>" if title else "<plotly figure>"

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        return self._mime_bundle()

    def _ipython_display_(self):
        from IPython.display import display

        display(self._mime_bundle(), raw=True)


def _png(drawn) -> str:
    import base64
    import io

    import matplotlib.pyplot as plt

    fig = drawn if hasattr(drawn, "savefig") else drawn.figure
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _figure(fig: go.Figure | None, title: str, height: int = 420, width: int | None = None, still=None) -> go.Figure:
    if fig is not None:
        return fig
    fig = LabFigure(still=still)
    fig.update_layout(
        title=dict(text=title, font=dict(size=13)),
        height=height,
        width=width,
        margin=dict(l=60, r=20, t=50, b=50),
        template="plotly_white",
    )
    return fig


def histogram(
    run: Run,
    stage: str,
    pos: int | None = -1,
    bins=80,
    fig=None,
    row=None,
    col=None,
    ax=None,
    sample: int | None = None,
):
    """Histogram of one stage's values (one position, or all with pos=None) → a go.Figure.

    Hover gives each bar's count and range. A few outliers do not stretch the axis: the bars cover
    the central 99% (widened by half) when outliers reach more than 10× beyond it; they are counted beside
    the plot (an annotation) with the extremes. With `ax=` (or `sample=`, or bin edges), the
    matplotlib version (labkit.viz.static.histogram) draws on that Axes and returns it."""
    if ax is not None or sample or np.ndim(bins):
        return static.histogram(run, stage, pos, bins, ax=ax, sample=sample)
    v = as_f64(run.at(stage, pos)).ravel()
    v = v[np.isfinite(v)]
    hist, edges, (below, above) = robust_histogram(v, bins)
    where = f"position {pos}" if pos is not None else "all positions"
    fig = _figure(
        fig, run_title(run, f"{stage} at {where}"), 320, still=lambda: static.histogram(run, stage, pos, bins)
    )
    ranges = [f"[{a:.4g}, {b:.4g})" for a, b in zip(edges[:-1], edges[1:])]
    fig.add_bar(
        x=(edges[:-1] + edges[1:]) / 2,
        y=hist,
        width=np.diff(edges),
        customdata=ranges,
        marker_color="#4c72b0",
        name=stage,
        row=row,
        col=col,
        hovertemplate="values in %{customdata}<br>count %{y}<extra></extra>",
    )
    side = [f"{v.size} finite values"]
    if v.size:
        side.append(f"min {v.min():.4g} · max {v.max():.4g}")
    side.append(f"outliers off the axis: {below} below, {above} above")
    fig.add_annotation(
        text="<br>".join(side),
        xref="paper",
        yref="paper",
        x=1,
        y=1,
        showarrow=False,
        align="right",
        font=dict(size=11),
        bgcolor="rgba(255,255,255,0.8)",
    )
    fig.update_xaxes(title_text="value", row=row, col=col)
    fig.update_yaxes(title_text="count", row=row, col=col)
    return fig


def attention_map(
    run: Run,
    layer: int,
    head: int = 0,
    probs: bool = True,
    labels: list[str] | None = None,
    fig=None,
    row=None,
    col=None,
    ax=None,
):
    """One head's [query, key] attention probabilities (or masked scores) → a go.Figure.

    Hover names the query token, the key token and the probability. Rows are the real query
    positions (a decode step's one row is position n_past). `labels`: one text per key position;
    by default the run's own tokens, `3 ' sky'`. With `ax=`, the matplotlib version draws there
    and the Axes is returned."""
    if ax is not None:
        return static.attention_map(run, layer, head, probs, ax=ax, labels=labels)
    name = f"blk.{layer}.attn_probs" if probs else f"blk.{layer}.attn_scores"
    m = as_f64(run.head(name, head))
    q_pos = [run.n_past + p for p in run.rows(name)]
    keys = [f"{i} {t!r}" for i, t in enumerate(labels)] if labels else token_labels(run, m.shape[1])
    if keys is None or len(keys) != m.shape[1]:  # positions only (a category axis merges equal labels)
        keys = [str(k) for k in range(m.shape[1])]
    queries = [keys[p] if p < len(keys) else str(p) for p in q_pos]
    z = np.where(np.isfinite(m), m, np.nan)  # masked (-inf) cells stay blank
    fig = _figure(
        fig,
        run_title(run, f"layer {layer} head {head} {'probabilities' if probs else 'scores'}"),
        height=max(360, 22 * len(queries) + 160),
        width=max(420, 22 * len(keys) + 220),
        still=lambda: static.attention_map(run, layer, head, probs, labels=labels),
    )
    what = "probability" if probs else "score"
    fig.add_heatmap(
        z=z,
        x=keys,
        y=queries,
        colorscale="Viridis",
        zmin=0 if probs else None,
        zmax=1 if probs else None,
        colorbar=dict(title=what),
        row=row,
        col=col,
        name=name,
        hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{what} %{{z:.4f}}<extra></extra>",
    )
    fig.update_yaxes(autorange="reversed", title_text="query", type="category", row=row, col=col)
    fig.update_xaxes(title_text="key", type="category", tickangle=-60, row=row, col=col)
    return fig


def divergence(cmp: Comparison | Attribution, fig=None, row=None, col=None, ax=None):
    """A heat map of layers × stage kinds colored by log10 NMSE → a go.Figure.

    Given a Comparison: each stage's total NMSE against the reference; given an Attribution
    (labkit.attribute): each stage's own (local) NMSE, hover with local, band, inherited and
    total. Failing (guilty) stages are outlined, the first is marked ✕. Blank cells: no such
    stage in that row. With `ax=`, the matplotlib version draws there and the Axes is returned."""
    if ax is not None:
        return static.divergence(cmp, ax=ax)
    g = divergence_grid(cmp)
    z = np.log10(np.clip(g.nmse, 1e-20, 1e20))  # inf (a shape or inf mismatch) at the top
    text = np.array(g.hover)
    fig = _figure(
        fig,
        g.title,
        height=max(380, 16 * len(g.rows) + 200),
        width=max(640, 34 * len(g.kinds) + 220),
        still=lambda: static.divergence(cmp),
    )
    fig.add_heatmap(
        z=z,
        x=g.kinds,
        y=g.rows,
        text=text,
        hovertemplate="%{text}<extra></extra>",
        colorscale="Magma",
        reversescale=True,
        zmin=-16,
        zmax=max(1.0, float(np.nanmax(z))),
        colorbar=dict(title="log10 local NMSE" if g.local else "log10 NMSE"),
        row=row,
        col=col,
        name="nmse",
    )
    bad = np.argwhere(~g.passed)
    if len(bad):
        fig.add_scatter(
            x=[g.kinds[j] for _, j in bad],
            y=[g.rows[i] for i, _ in bad],
            mode="markers",
            hoverinfo="skip",
            marker=dict(symbol="square-open", size=12, color="#d62728"),
            name="guilty" if g.local else "fails",
            row=row,
            col=col,
        )
    if g.first is not None:
        i, j = g.first
        fig.add_scatter(
            x=[g.kinds[j]],
            y=[g.rows[i]],
            mode="markers",
            hoverinfo="skip",
            name="first guilty" if g.local else "first divergence",
            marker=dict(symbol="x", size=14, color="#1f77b4"),
            row=row,
            col=col,
        )
    fig.update_yaxes(autorange="reversed", type="category", row=row, col=col)
    fig.update_xaxes(type="category", tickangle=-45, row=row, col=col)
    fig.update_layout(showlegend=False)
    return fig


def _lens(x: Run | LogitLens) -> LogitLens:
    return x if isinstance(x, LogitLens) else x.logit_lens()


def logit_lens(run_or_lens: Run | LogitLens, fig=None, row=None, col=None) -> go.Figure:
    """The logit lens as a heat map of layers × positions → a go.Figure: each cell is the top
    token of that layer's residual read through the final norm and unembedding, colored by its
    probability; hover gives the input token, the top token and its probability."""
    lens = _lens(run_or_lens)
    ids, probs = lens.winners()
    inputs = [f"{p} {lens.piece(t)!r}" for p, t in zip(lens.positions, lens.tokens)]
    layers = [f"layer {s.split('.')[1]}" for s in lens.stages]
    tops = np.array([[lens.piece(int(i)) for i in r] for r in ids])
    fig = _figure(
        fig,
        lens_title(lens, "logit lens: top token per layer"),
        height=max(420, 22 * len(layers) + 180),
        width=max(560, 80 * len(inputs) + 200),
        still=lambda: static.logit_lens(lens),
    )
    fig.add_heatmap(
        z=probs,
        x=inputs,
        y=layers,
        text=tops,
        texttemplate="%{text}",
        textfont=dict(size=10),
        colorscale="Blues",
        zmin=0,
        zmax=1,
        colorbar=dict(title="probability"),
        row=row,
        col=col,
        hovertemplate="input %{x}<br>%{y}: top %{text}<br>probability %{z:.3f}<extra></extra>",
    )
    fig.update_yaxes(autorange="reversed", type="category", row=row, col=col)
    fig.update_xaxes(type="category", title_text="position (input token)", row=row, col=col)
    return fig


def tracked_tokens(run_or_lens: Run | LogitLens, tokens: list[int], pos: int = -1) -> go.Figure:
    """Rank (log scale, 0 = top-1 drawn at 1) and lens logit of chosen tokens across layers → a go.Figure."""
    from plotly.subplots import make_subplots

    lens = _lens(run_or_lens)
    fig = LabFigure(
        make_subplots(rows=1, cols=2, subplot_titles=("rank (1 = top)", "lens logit")),
        still=lambda: static.tracked_tokens(lens, tokens, pos),
    )
    fig.update_layout(
        title=dict(text=lens_title(lens, f"tracked tokens at position {pos}"), font=dict(size=13)),
        height=380,
        template="plotly_white",
    )
    layers = list(range(len(lens.stages)))
    for t in tokens:
        name = repr(lens.piece(int(t)))
        ranks = [r + 1 for r in lens.ranks(t, pos)]
        fig.add_scatter(
            x=layers,
            y=ranks,
            name=name,
            legendgroup=name,
            row=1,
            col=1,
            hovertemplate=f"{name}<br>layer %{{x}}<br>rank %{{y}}<extra></extra>",
        )
        fig.add_scatter(
            x=layers,
            y=lens.logits(t, pos),
            name=name,
            legendgroup=name,
            showlegend=False,
            row=1,
            col=2,
            hovertemplate=f"{name}<br>layer %{{x}}<br>logit %{{y:.2f}}<extra></extra>",
        )
    fig.update_yaxes(type="log", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="layer")
    return fig


def router_map(run: Run, layer: int, fig=None, row=None, col=None, ax=None):
    """One layer's router probabilities [token, expert] → a go.Figure; each token's selected experts
    are marked, and hover names the token, the expert, its probability, and, where it was selected,
    its rank and weight. With `ax=`, the matplotlib version draws there."""
    if ax is not None:
        return static.router_map(run, layer, ax=ax)
    probs, what = router_probabilities(run, layer)
    ids = np.asarray(run[f"blk.{layer}.ffn_topk"])
    w_name = f"blk.{layer}.ffn_expert_weights"
    weights = as_f64(run[w_name]) if w_name in run.captures else np.full(ids.shape, np.nan)
    tokens = token_labels(run, probs.shape[0]) or [str(p) for p in range(probs.shape[0])]
    experts = [str(e) for e in range(probs.shape[1])]
    picked = np.full(probs.shape, "", dtype=object)
    for t in range(ids.shape[0]):
        for j, e in enumerate(ids[t]):
            picked[t, e] = f"<br>selected: rank {j + 1}, weight {weights[t, j]:.4f}"
    fig = _figure(fig, run_title(run, f"layer {layer} router: {what}, selected experts marked"),
                  height=max(320, 20 * len(tokens) + 160), width=max(420, 22 * len(experts) + 220),
                  still=lambda: static.router_map(run, layer))  # fmt: skip
    fig.add_heatmap(
        z=probs,
        x=experts,
        y=tokens,
        customdata=picked,
        colorscale="Viridis",
        zmin=0,
        colorbar=dict(title="probability"),
        row=row,
        col=col,
        name=f"blk.{layer}.ffn_router_probs",
        hovertemplate="token %{y}<br>expert %{x}<br>probability %{z:.4f}%{customdata}<extra></extra>",
    )
    rows = np.repeat(range(ids.shape[0]), ids.shape[1])
    ring = dict(symbol="circle-open", size=12, color="#e45756", line=dict(width=2))
    fig.add_scatter(x=[experts[e] for e in ids.ravel()], y=[tokens[t] for t in rows], mode="markers", marker=ring,
                    hoverinfo="skip", showlegend=False, row=row, col=col)  # fmt: skip
    fig.update_yaxes(autorange="reversed", title_text="token", type="category", row=row, col=col)
    fig.update_xaxes(title_text="expert", type="category", row=row, col=col)
    return fig


def expert_load(run: Run, fig=None, row=None, col=None, ax=None):
    """Tokens routed to each expert, per layer [layer, expert] → a go.Figure (hover: the count and its
    share of the layer's k·T slots). With `ax=`, the matplotlib version draws there."""
    if ax is not None:
        return static.expert_load(run, ax=ax)
    load = static.expert_counts(run)
    share = load / np.maximum(load.sum(axis=1, keepdims=True), 1)
    layers = [str(L) for L in sorted(int(s.split(".")[1]) for s in run.captures if s.endswith(".ffn_topk"))]
    fig = _figure(fig, run_title(run, "expert load: tokens routed to each expert"),
                  height=max(260, 26 * len(layers) + 160), width=max(420, 22 * load.shape[1] + 220),
                  still=lambda: static.expert_load(run))  # fmt: skip
    fig.add_heatmap(z=load, x=[str(e) for e in range(load.shape[1])], y=layers, customdata=share,
                    colorscale="Magma", zmin=0, colorbar=dict(title="tokens"), row=row, col=col,
                    hovertemplate="layer %{y}<br>expert %{x}<br>%{z} tokens "
                                  "(%{customdata:.1%} of the slots)<extra></extra>")  # fmt: skip
    fig.update_yaxes(autorange="reversed", title_text="layer", type="category", row=row, col=col)
    fig.update_xaxes(title_text="expert", type="category", row=row, col=col)
    return fig


def kernel_times(times: KernelTimes, fig=None, row=None, col=None, ax=None):
    """GPU milliseconds per kernel variant (labkit.kernel_trial.time_kernels) → a go.Figure: a bar at
    each variant's median, a dot per repeat (hover: the variant, its time, and its ratio to the
    first variant's). With `ax=`, the matplotlib version draws there."""
    if ax is not None:
        return static.kernel_times(times, ax=ax)
    names = list(times.ms)
    base = times.median(names[0])
    fig = _figure(fig, kernel_times_title(times), height=360, width=max(420, 110 * len(names) + 200),
                  still=lambda: static.kernel_times(times))  # fmt: skip
    fig.add_bar(x=names, y=[times.median(v) for v in names], marker_color="#4c78a8", row=row, col=col,
                customdata=[times.median(v) / base for v in names], name="median",
                hovertemplate="kernel %{x}<br>median %{y:.2f} ms<br>%{customdata:.2f}x the time of "
                              f"{names[0]}<extra></extra>")  # fmt: skip
    xs = [v for v in names for _ in times.ms[v]]
    fig.add_scatter(x=xs, y=[m for v in names for m in times.ms[v]], mode="markers", name="each repeat",
                    marker=dict(color="#e45756", size=7), row=row, col=col,
                    hovertemplate="kernel %{x}<br>one repeat %{y:.2f} ms<extra></extra>")  # fmt: skip
    fig.update_layout(hovermode="x")  # a category's tooltip anywhere above it, a short bar's too
    spread = max(times.median(v) for v in names) / max(min(times.median(v) for v in names), 1e-9)
    scale = dict(type="log") if spread > 20 else dict(rangemode="tozero")  # a 100x kernel hides a 1x bar
    fig.update_yaxes(title_text="GPU ms (sum over layers)", row=row, col=col, **scale)
    fig.update_xaxes(title_text=f"{times.family} kernel", type="category", row=row, col=col)
    return fig


def paths_map(report: PathsReport, engine: str = "gpu", fig=None, row=None, col=None, ax=None):
    """Each serving path's difference from the one-shot pass of the same engine, stage by stage
    [path, stage] (labkit.serving_paths) → a go.Figure: log10 NMSE, bitwise-equal stages drawn at the
    floor (hover: the path, the stage, its NMSE and whether it is bitwise equal). With `ax=`, the
    matplotlib version draws there."""
    if ax is not None:
        return static.paths_map(report, engine, ax=ax)
    rows, stages, z, text = paths_grid(report, engine)
    width = min(1100, max(600, 9 * len(stages) + 260))  # a few hundred stages: a column each would run off the page
    fig = _figure(fig, paths_title(report, engine), height=max(260, 40 * len(rows) + 180), width=width,
                  still=lambda: static.paths_map(report, engine))  # fmt: skip
    fig.add_heatmap(z=z, x=stages, y=rows, customdata=text, colorscale="Viridis", zmin=-20, zmax=0,
                    colorbar=dict(title="log10 NMSE"), row=row, col=col,
                    hovertemplate="path %{y}<br>stage %{x}<br>NMSE %{customdata}<extra></extra>")  # fmt: skip
    fig.update_xaxes(title_text="stage (graph order)", showticklabels=len(stages) <= 60, row=row, col=col)
    fig.update_yaxes(title_text="path", autorange="reversed", type="category", row=row, col=col)
    return fig
