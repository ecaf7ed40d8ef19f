"""Figures for the post-mortem cases. Presentation only: the numbers come from Runs and from the
measurements in labkit.casebook (a LogitLens, sampled draws, per-position NMSE lists)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from labkit.captures import Run


def stage_magnitudes(runs: dict[str, Run], stages: list[str], pos: int | None = None, ax=None, log: bool = True):
    """max |x| of each stage, one line per run (e.g. faulty vs fixed): where values explode and
    where a norm hides it."""
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    for label, run in runs.items():
        vals = []
        for s in stages:
            a = np.asarray(run[s] if pos is None else run[s][pos], dtype=np.float64)
            a = a[np.isfinite(a)]
            vals.append(float(np.max(np.abs(a))) if a.size else np.nan)
        ax.plot(range(len(stages)), vals, marker="o", label=label)
    ax.set_xticks(range(len(stages)), [s.replace("blk.", "") for s in stages], rotation=60, fontsize=7)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("max |x|")
    ax.set_title("magnitude per stage" + ("" if pos is None else f" at position {pos}"))
    ax.legend(fontsize=7)
    return ax


def lens_ranks(lenses: dict[str, object], tokens: list[int], ax=None):
    """Rank of tracked tokens at every layer through a logit lens (0 = top-1), one panel line per
    (run, token). `lenses` maps a label to a labkit.lens.LogitLens."""
    ax = ax or plt.subplots(figsize=(7, 3.2))[1]
    styles = ["-", "--", ":", "-."]
    for k, (label, lens) in enumerate(lenses.items()):
        for t in tokens:
            ranks = np.asarray(lens.ranks(t), dtype=float) + 1  # log scale: rank 0 -> 1
            ax.plot(ranks, ls=styles[k % len(styles)], marker=".", label=f"{label}: {lens.piece(t)!r}")
    ax.set_yscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("layer")
    ax.set_ylabel("rank + 1 (top = 1)")
    ax.set_title("logit lens: tracked tokens through the layers")
    ax.legend(fontsize=7)
    return ax


def sampled_vs_exact(
    draws: np.ndarray, ids: np.ndarray, probs: np.ndarray, piece=str, k: int = 20, ax=None, title: str = ""
):
    """Empirical frequency of the k most likely tokens (by the exact distribution) against their
    exact probability."""
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    order = np.argsort(-np.asarray(probs))[:k]
    top_ids = np.asarray(ids)[order]
    draws = np.asarray(draws)
    freq = np.array([np.mean(draws == t) for t in top_ids])
    x = np.arange(len(top_ids))
    ax.bar(x - 0.2, np.asarray(probs)[order], width=0.4, label="exact", color="#4c72b0")
    ax.bar(x + 0.2, freq, width=0.4, label=f"sampled ({draws.size})", color="#dd8452")
    ax.set_xticks(x, [repr(piece(int(t))) for t in top_ids], rotation=70, fontsize=7)
    ax.set_ylabel("probability")
    ax.set_title(title or f"top-{k} tokens: sampled frequency vs exact probability")
    ax.legend(fontsize=7)
    return ax


def per_position(values: dict[str, list[float]], ax=None, ylabel: str = "NMSE vs reference", log: bool = True):
    """One line per series over token positions (e.g. a stage's NMSE at each position)."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for label, v in values.items():
        v = np.maximum(np.asarray(v, dtype=float), 1e-20) if log else np.asarray(v, dtype=float)
        ax.plot(v, marker="o", label=label)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return ax


def logit_rows(run: Run, pos: int = -1, ax=None, bad_rows: list[tuple[int, int]] | None = None):
    """The raw logits over the vocabulary index at one position; NaN rows shaded (unwritten)."""
    ax = ax or plt.subplots(figsize=(8, 2.8))[1]
    with np.errstate(invalid="ignore"):  # debug poison is a signalling NaN: casting it warns
        z = np.asarray(run["logits"][pos], dtype=np.float64)
    ax.plot(np.where(np.isfinite(z), z, np.nan), lw=0.3, color="#4c72b0")
    for a, b in bad_rows or []:
        ax.axvspan(a, b, color="#c44e52", alpha=0.3, label=f"unwritten {a}-{b}")
    ax.set_xlabel("vocabulary row")
    ax.set_ylabel("logit")
    ax.set_title(f"logits at position {pos}")
    if bad_rows:
        ax.legend(fontsize=7)
    return ax
