"""Matplotlib figures of captures. Pure presentation: every number comes from a Run."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from labkit.captures import Run
from labkit.compare import Comparison


def histogram(run: Run, stage: str, pos: int | None = -1, bins: int = 80, ax=None, sample: int | None = None):
    """Histogram of one stage's values (at one position). `sample` marks the first n values read
    on their own, the way post-mortem 000's "all positive" 5-value readout was taken."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    a = run[stage]
    a = a[pos] if pos is not None else a
    v = np.asarray(a, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    ax.hist(v, bins=bins, color="#4c72b0")
    if sample:
        for x in v[:sample]:
            ax.axvline(x, color="#c44e52", lw=1)
        ax.set_title(f"{stage} pos={pos}: {sample} red lines = first {sample} values; bars = all {v.size}")
    else:
        ax.set_title(f"{stage} pos={pos}: min {v.min():.3g} max {v.max():.3g}")
    ax.axvline(0, color="k", lw=0.5)
    return ax


def attention_map(run: Run, layer: int, head: int = 0, probs: bool = True, ax=None, labels: list[str] | None = None):
    """[q_pos, k_pos] attention probabilities (or masked scores) of one head."""
    ax = ax or plt.subplots(figsize=(4, 4))[1]
    name = f"blk.{layer}.attn_probs" if probs else f"blk.{layer}.attn_scores"
    m = run[name][head]
    m = np.where(np.isfinite(m), m, np.nan)
    im = ax.imshow(m, cmap="viridis", interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(f"{name} head {head}")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    if labels:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
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
