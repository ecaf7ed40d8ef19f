"""Matplotlib figures of captures, for where a still image is what is needed: the widgets' PNGs,
side-by-side panels (`ax=`), and printed material. Each takes `ax=` (or `fig=`) to compose and
returns the Axes (or Figure) it drew on. The interactive versions are in labkit.viz.interactive."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from labkit.attribution import Attribution
from labkit.captures import Run, as_f64
from labkit.compare import Comparison
from labkit.kernel_trial import KernelTimes
from labkit.serving_paths import PathsReport
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


def histogram(run: Run, stage: str, pos: int | None = -1, bins=80, ax=None, sample: int | None = None):
    """Histogram of one stage's values (at one position, or all with pos=None) → the Axes.

    A few outliers do not stretch the axis: the bars cover the central 99% (widened by half) when outliers
    reach more than 10× beyond it, and the outliers are counted in the title. `bins` may be
    edges (then they are used as given). `sample` marks the first n values read on their own,
    the way post-mortem 000's "all positive" 5-value readout was taken."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    v = as_f64(run.at(stage, pos)).ravel()
    v = v[np.isfinite(v)]
    if np.ndim(bins):
        edges = np.asarray(bins, float)
        hist = np.histogram(v, bins=edges)[0]
        out = (int(np.sum(v < edges[0])), int(np.sum(v > edges[-1])))
    else:
        hist, edges, out = robust_histogram(v, int(bins))
    ax.stairs(hist, edges, fill=True, color="#4c72b0")
    where = f"pos={pos}" if pos is not None else "all positions"
    if not v.size:
        ax.set_title(f"{stage} {where}: no finite value", fontsize=9)
        return ax
    extra = f"; outside the axis: {out[0]} below, {out[1]} above" if sum(out) else ""
    stats = f"{v.size} values in [{v.min():.3g}, {v.max():.3g}]{extra}"
    ax.set_title(f"{run_title(run, f'{stage} {where}')}\n{stats}", fontsize=8)
    if sample:
        for x in v[:sample]:
            ax.axvline(min(max(x, edges[0]), edges[-1]), color="#c44e52", lw=1)
        ax.set_xlabel(f"red lines: the first {sample} values read on their own", fontsize=8)
    ax.axvline(0, color="k", lw=0.5)
    return ax


def attention_map(run: Run, layer: int, head: int = 0, probs: bool = True, ax=None, labels: list[str] | None = None):
    """[q_pos, k_pos] attention probabilities (or masked scores) of one head → the Axes.

    Rows are labeled with their real query positions (a decode step's one row is position
    n_past, not 0), and with token pieces where the run knows them: `labels` (one per key
    position), else the run's own tokens when they are all the keys (a prompt pass)."""
    ax = ax or plt.subplots(figsize=(4, 4))[1]
    name = f"blk.{layer}.attn_probs" if probs else f"blk.{layer}.attn_scores"
    m = run.head(name, head)
    m = np.where(np.isfinite(m), m, np.nan)
    im = ax.imshow(m, cmap="viridis", interpolation="nearest", aspect="auto")
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(run_title(run, f"{name} head {head}"), fontsize=8)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    q_pos = [run.n_past + p for p in run.rows(name)]
    keys = labels
    if keys is None and run.piece is not None and run.n_past == 0 and len(run.tokens) == m.shape[1]:
        keys = [run.piece(t) for t in run.tokens]
    named = keys is not None and len(keys) == m.shape[1]
    if m.shape[1] <= 64:
        ax.set_xticks(
            range(m.shape[1]),
            [f"{k} {keys[k]!r}" if named else str(k) for k in range(m.shape[1])],
            rotation=90,
            fontsize=7,
        )
    if len(q_pos) <= 64:
        ax.set_yticks(range(len(q_pos)), [f"{p} {keys[p]!r}" if named else str(p) for p in q_pos], fontsize=7)
    return ax


def layer_trajectory(run: Run, n_layers: int, positions: tuple[int, ...] = (0, -1), kind: str = "resid_out", ax=None):
    """min/max of a per-layer stage at chosen positions (post-mortem 000's method) → the Axes."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for pos in positions:
        lo = [run.stats(f"blk.{L}.{kind}", pos=pos).min for L in range(n_layers)]
        hi = [run.stats(f"blk.{L}.{kind}", pos=pos).max for L in range(n_layers)]
        line = ax.plot(hi, label=f"max pos={pos}")[0]
        ax.plot(lo, ls="--", color=line.get_color(), label=f"min pos={pos}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_title(run_title(run, f"{kind} range per layer"), fontsize=9)
    ax.legend(fontsize=7)
    return ax


def logit_ranking(run: Run, k: int = 10, pos: int = -1, ax=None, track: list[int] | None = None):
    """Bar chart of the top-k next tokens with their probabilities → the Axes.

    `track`: token ids shown too, with their rank (#1 = top), even when they are outside the top k."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    top = run.top(k, pos=pos)
    p = run.probs(pos)
    shown = [(f"#{i + 1} {t.piece!r}", t.prob, "#55a868") for i, t in enumerate(top)]
    for t in track or []:
        if t not in [x.id for x in top]:
            rank = int(np.sum(p > p[t]))
            piece = run.piece(int(t)) if run.piece else str(t)
            shown.append((f"#{rank + 1} {piece!r} (tracked)", float(p[t]), "#dd8452"))
    ax.barh([s[0] for s in shown][::-1], [s[1] for s in shown][::-1], color=[s[2] for s in shown][::-1])
    ax.set_xlabel("probability")
    ax.set_title(run_title(run, f"top-{k} at position {pos}"), fontsize=9)
    return ax


def divergence(cmp: Comparison | Attribution, ax=None):
    """log10 NMSE per layer × stage kind (total for a Comparison, each stage's own for an
    Attribution), failures (guilty stages) outlined in red, the first marked ✕ → the Axes."""
    g = divergence_grid(cmp)
    ax = ax or plt.subplots(figsize=(max(6, 0.45 * len(g.kinds) + 2), max(3, 0.22 * len(g.rows) + 1.2)))[1]
    z = np.log10(np.clip(g.nmse, 1e-20, 1e20))  # inf (a shape or inf mismatch) at the top
    im = ax.imshow(z, cmap="magma_r", aspect="auto", interpolation="nearest", vmin=-16, vmax=max(1, np.nanmax(z)))
    ax.figure.colorbar(im, ax=ax, fraction=0.03, label="log10 local NMSE" if g.local else "log10 NMSE")
    bad = np.argwhere(~g.passed)
    ax.scatter(bad[:, 1], bad[:, 0], marker="s", s=30, facecolors="none", edgecolors="#d62728", linewidths=1)
    if g.first is not None:
        ax.scatter([g.first[1]], [g.first[0]], marker="x", s=60, color="#1f77b4", linewidths=2)
    ax.set_xticks(range(len(g.kinds)), g.kinds, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(g.rows)), g.rows, fontsize=6)
    ax.set_title(g.title, fontsize=8)
    return ax


def attention_grid(run: Run, layer: int, probs: bool = True, labels: list[str] | None = None, fig=None):
    """Every head's [q_pos, k_pos] map of one layer side by side, on a shared color scale → the Figure."""
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
    labels = labels or token_labels(run, a.shape[2])
    for ax, h in zip(axs, heads):
        m = np.where(np.isfinite(a[h]), a[h], np.nan)
        im = ax.imshow(m, cmap="viridis", interpolation="nearest", vmin=lo, vmax=hi)
        ax.set_title(f"head {h}", fontsize=8)
        if labels and len(labels) == m.shape[1] and m.shape[1] <= 32:
            ax.set_xticks(range(m.shape[1]), labels, rotation=90, fontsize=6)
            ax.set_yticks(range(m.shape[0]), labels[-m.shape[0] :], fontsize=6)
        else:
            ax.tick_params(labelsize=6)
    for ax in axs[len(heads) :]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=list(axs[: len(heads)]), fraction=0.02)
    fig.suptitle(run_title(run, f"{name}: rows = query, columns = key"), fontsize=9)
    return fig


def logit_lens(lens, ax=None):
    """The logit lens (labkit.lens.LogitLens): layers × positions colored by the top token's
    probability, the token written in each cell → the Axes."""
    ids, probs = lens.winners()
    n_layers, n_pos = probs.shape
    ax = ax or plt.subplots(figsize=(1.3 * n_pos + 2, 0.32 * n_layers + 1.5))[1]
    ax.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for L in range(n_layers):
        for p in range(n_pos):
            color = "white" if probs[L, p] > 0.6 else "black"
            ax.text(p, L, repr(lens.piece(int(ids[L, p])))[:12], ha="center", va="center", fontsize=6, color=color)
    ax.set_xticks(range(n_pos), [f"{p} {lens.piece(t)!r}" for p, t in zip(lens.positions, lens.tokens)],
                  rotation=45, ha="right", fontsize=7)  # fmt: skip
    ax.set_yticks(range(n_layers), [s.split(".")[1] for s in lens.stages], fontsize=6)
    ax.set_ylabel("layer")
    ax.set_title(lens_title(lens, "logit lens"), fontsize=9)
    return ax


def tracked_tokens(lens, tokens: list[int], pos: int = -1, ax=None):
    """Rank (1 = top, log scale) of chosen tokens across layers of a logit lens → the Axes."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for t in tokens:
        ax.plot([r + 1 for r in lens.ranks(t, pos)], marker=".", label=repr(lens.piece(int(t))))
    ax.set_yscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("layer")
    ax.set_ylabel("rank")
    ax.legend(fontsize=7)
    ax.set_title(lens_title(lens, f"tracked tokens at position {pos}"), fontsize=9)
    return ax


def router_map(run: Run, layer: int, ax=None):
    """One layer's router probabilities [token, expert] with each token's selected experts ringed →
    the Axes. A token's row shows how much each expert suits it; the rings are where it went."""
    (probs, what), ids = router_probabilities(run, layer), np.asarray(run[f"blk.{layer}.ffn_topk"])
    ax = ax or plt.subplots(figsize=(max(4, 0.25 * probs.shape[1] + 2), max(3, 0.25 * probs.shape[0] + 1.5)))[1]
    im = ax.imshow(probs, cmap="viridis", interpolation="nearest", aspect="auto", vmin=0)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, label="probability")
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    ax.scatter(ids.ravel(), rows, s=60, facecolors="none", edgecolors="#e45756", linewidths=1.2)
    ax.set_title(run_title(run, f"layer {layer} router: {what}, selected ringed"), fontsize=8)
    ax.set_xlabel("expert")
    ax.set_ylabel("token position")
    return ax


def expert_load(run: Run, ax=None):
    """How many tokens each expert received, per layer [layer, expert] → the Axes."""
    load = expert_counts(run)
    ax = ax or plt.subplots(figsize=(max(4, 0.25 * load.shape[1] + 2), max(2.5, 0.35 * load.shape[0] + 1.5)))[1]
    im = ax.imshow(load, cmap="magma", interpolation="nearest", aspect="auto", vmin=0)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, label="tokens")
    ax.set_title(run_title(run, "expert load: tokens routed to each expert"), fontsize=8)
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    return ax


def expert_counts(run: Run) -> np.ndarray:
    """[layer, expert]: the tokens of the run each layer sent to each expert (its ffn_topk)."""
    layers = sorted(int(s.split(".")[1]) for s in run.captures if s.endswith(".ffn_topk"))
    n = run[f"blk.{layers[0]}.ffn_router_probs"].shape[1] if f"blk.{layers[0]}.ffn_router_probs" in run.captures else 0
    n = max(n, 1 + max(int(np.max(run[f"blk.{L}.ffn_topk"])) for L in layers))
    return np.stack([np.bincount(np.asarray(run[f"blk.{L}.ffn_topk"]).ravel(), minlength=n) for L in layers])


def kernel_times(times: KernelTimes, ax=None):
    """GPU milliseconds per kernel variant, the median as a bar and each repeat as a dot → the Axes."""
    names = list(times.ms)
    ax = ax or plt.subplots(figsize=(max(4, 1.1 * len(names) + 1.5), 3))[1]
    ax.bar(names, [times.median(v) for v in names], color="#4c78a8")
    for i, v in enumerate(names):
        ax.plot([i] * len(times.ms[v]), times.ms[v], "o", color="#e45756", markersize=4)
    medians = [times.median(v) for v in names]
    if max(medians) > 20 * max(min(medians), 1e-9):
        ax.set_yscale("log")  # a 100x kernel hides a 1x bar
    ax.set_title(kernel_times_title(times), fontsize=8)
    ax.set_ylabel("GPU ms (sum over layers)")
    ax.set_xlabel(f"{times.family} kernel")
    return ax


def paths_map(report: PathsReport, engine: str = "gpu", ax=None):
    """Each path's log10 NMSE against the one-shot pass, stage by stage → the Axes."""
    rows, stages, z, _ = paths_grid(report, engine)
    ax = ax or plt.subplots(figsize=(max(5, 0.05 * len(stages) + 3), max(2, 0.4 * len(rows) + 1.2)))[1]
    im = ax.imshow(z, cmap="viridis", vmin=-20, vmax=0, interpolation="nearest", aspect="auto")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, label="log10 NMSE")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_title(paths_title(report, engine), fontsize=8)
    ax.set_xlabel(f"stage (graph order, {len(stages)})")
    return ax
