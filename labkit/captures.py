"""Run: the captured stage outputs of one forward pass, whichever engine produced them.

GPU runs, float64 reference runs and llama.cpp oracle runs are all `Run`s with the
same stage names, so compare and viz code never needs to know where data came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from labkit.errors import UnknownStageError

# The bit pattern a debug run fills every output region with before the pass (a NaN payload that
# no arithmetic produces); an element still holding it afterwards was never written. Defined here,
# not in the GPU package, because data flows file → model → gpu → captures.
POISON_BITS = 0x7FBADBAD


@dataclass(frozen=True)
class Stats:
    """Summary of one capture (optionally one position): what a debugger prints first."""

    stage: str
    shape: tuple[int, ...]
    min: float
    max: float
    mean: float
    std: float
    rms: float
    nan: int
    inf: int
    unwritten: int

    def __str__(self) -> str:
        return (
            f"{self.stage} {self.shape}: min={self.min:.4g} max={self.max:.4g} mean={self.mean:.4g} "
            f"std={self.std:.4g} rms={self.rms:.4g} nan={self.nan} inf={self.inf} unwritten={self.unwritten}"
        )


@dataclass(frozen=True)
class TopToken:
    piece: str
    id: int
    logit: float
    prob: float

    def __iter__(self):  # so `piece, id, logit, prob = t` works
        return iter((self.piece, self.id, self.logit, self.prob))


@dataclass
class Run:
    """Captures of one pass. Arrays are [positions, ...]; attention maps are [heads, q_pos, k_pos]."""

    model: str
    engine: str
    tokens: list[int]
    stages: list[str]
    captures: dict[str, np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)
    unwritten: dict[str, int] = field(default_factory=dict)
    variants: dict[str, str] = field(default_factory=dict)
    piece: Callable[[int], str] | None = field(default=None, repr=False)
    n_past: int = 0  # positions before this pass (KV cache) — 0 for a prompt pass

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.captures:
            if name in self.stages:
                raise UnknownStageError(
                    f"stage {name!r} was not captured in this run: a names filter left it out, or the selected "
                    "variants do not compute it (a fused attn_ctx variant has no attention scores or probs)"
                )
            raise UnknownStageError(f"unknown stage {name!r}; stages are e.g. {', '.join(self.stages[:6])}, ...")
        return self.captures[name]

    def __contains__(self, name: str) -> bool:
        return name in self.captures

    @property
    def debug(self) -> bool:
        """A debug run: outputs were poisoned before the pass, so unwritten elements can be counted."""
        return bool(self.unwritten)

    def unwritten_count(self, a: np.ndarray) -> int:
        """Elements of `a` (part of a capture of this run) still holding the poison pattern."""
        a = np.asarray(a)
        if not self.debug or a.dtype != np.float32:
            return 0
        return int(np.count_nonzero(np.ascontiguousarray(a).view(np.uint32) == POISON_BITS))

    def stats(self, name: str, pos: int | None = None) -> Stats:
        """min/max/mean/std/rms and NaN/inf/unwritten counts, over all values or one position.

        Unwritten elements are counted on debug runs only (a poison pattern needs poisoning first);
        the poison is a NaN payload, so they are in `nan` too."""
        a = self[name]
        if pos is not None:
            a = a[:, pos] if a.ndim == 3 and name.endswith(("attn_scores", "attn_probs")) else a[pos]
        with np.errstate(invalid="ignore"):  # the poison is a signalling NaN: casting it raises the flag
            a64 = np.asarray(a, dtype=np.float64)
        finite = a64[np.isfinite(a64)]
        if finite.size == 0:
            finite = np.zeros(1)
        return Stats(
            stage=name if pos is None else f"{name}[pos={pos}]",
            shape=tuple(a.shape),
            min=float(finite.min()),
            max=float(finite.max()),
            mean=float(finite.mean()),
            std=float(finite.std()),
            rms=float(np.sqrt(np.mean(finite**2))),
            nan=int(np.isnan(a64).sum()),
            inf=int(np.isinf(a64).sum()),
            unwritten=int(self.unwritten[name]) if pos is None and name in self.unwritten else self.unwritten_count(a),
        )

    def logits(self, pos: int = -1) -> np.ndarray:
        return np.asarray(self["logits"][pos], dtype=np.float64)

    def probs(self, pos: int = -1) -> np.ndarray:
        z = self.logits(pos)
        z = np.where(np.isfinite(z), z, -np.inf)
        e = np.exp(z - z.max())
        return e / e.sum()

    def top(self, k: int = 5, pos: int = -1) -> list[TopToken]:
        """The k highest logits at `pos`: (piece, id, logit, prob), prob from a full-vocab softmax."""
        z = self.logits(pos)
        p = self.probs(pos)
        ids = np.argsort(-np.nan_to_num(z, nan=-np.inf), kind="stable")[:k]
        piece = self.piece or str
        return [TopToken(piece(int(i)), int(i), float(z[i]), float(p[i])) for i in ids]

    def __repr__(self) -> str:
        return (
            f"Run(model={self.model!r}, engine={self.engine!r}, tokens={self.tokens}, "
            f"stages={len(self.stages)}, captured={len(self.captures)})"
        )
