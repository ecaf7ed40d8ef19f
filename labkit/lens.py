"""The logit lens: each layer's residual stream read through the final norm and the unembedding,
as if the model stopped there. Shows at which layer a prediction forms.

    lens = run.logit_lens()                  # every layer × every position of a prompt pass
    lens.rank(lab.token_id(" blue"))         # its rank at the last layer (0 = top-1)
    lens.first_layer_in_top(token, k=10)     # the first layer where it enters the top 10

The unembedding comes from the run's lab (`Run.unembed`, float64), so a run loaded from another
engine's dumps has a lens whenever it was loaded with the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit.errors import InvalidArgumentError, UnknownStageError
from labkit.top_token import TopToken

MAX_LENS_BYTES = 1 << 30  # the [layers, positions, vocab] float32 logits a lens may hold
CALL_BYTES = 256 << 20  # the float64 logits of one unembedding call


@dataclass
class LogitLens:
    """`Z[L, i]`: the lens logits of layer L at `positions[i]` over the whole vocabulary (float32)."""

    model: str
    engine: str
    variants: dict[str, str]
    stages: list[str]  # the captures read, one per layer (blk.L.resid_out)
    positions: tuple[int, ...]
    tokens: list[int]  # the input token at each position
    Z: np.ndarray = field(repr=False)
    piece: Callable[[int], str] = field(repr=False, default=str)
    n_tokens: int = 0  # tokens in the run (a negative position counts from its end)

    def _col(self, pos: int) -> int:
        p = pos if pos >= 0 else (self.n_tokens or len(self.tokens)) + pos
        if p not in self.positions:
            raise InvalidArgumentError(f"the lens holds positions {list(self.positions)}, not {pos}")
        return self.positions.index(p)

    def probs(self, layer: int, pos: int = -1) -> np.ndarray:
        z = self.Z[layer, self._col(pos)].astype(np.float64)
        e = np.exp(z - z.max())
        return e / e.sum()

    def rank(self, token: int, layer: int = -1, pos: int = -1) -> int:
        """How many vocabulary entries score above `token` at this layer (0 = top-1)."""
        z = self.Z[layer, self._col(pos)]
        return int(np.sum(z > z[token]))

    def ranks(self, token: int, pos: int = -1) -> list[int]:
        return [self.rank(token, L, pos) for L in range(len(self.stages))]

    def logits(self, token: int, pos: int = -1) -> list[float]:
        return [float(x) for x in self.Z[:, self._col(pos), token]]

    def top(self, layer: int, pos: int = -1, k: int = 1) -> list[TopToken]:
        """The k winners of one layer at one position, with their lens probabilities."""
        z = self.Z[layer, self._col(pos)]
        ids = np.argsort(-z, kind="stable")[:k]
        p = self.probs(layer, pos)
        return [TopToken(self.piece(int(i)), int(i), float(z[i]), float(p[i])) for i in ids]

    def winners(self) -> tuple[np.ndarray, np.ndarray]:
        """The top-1 id and its probability at every (layer, position): two [layers, positions] arrays."""
        ids = np.argmax(self.Z, axis=2)
        z = self.Z.astype(np.float64)
        lse = np.log(np.sum(np.exp(z - z.max(axis=2, keepdims=True)), axis=2)) + z.max(axis=2)
        top = np.take_along_axis(z, ids[..., None], axis=2)[..., 0]
        return ids, np.exp(top - lse)

    def table(self, tokens: list[int], pos: int = -1) -> dict:
        """{piece: {"id", "ranks", "logits"}} of tracked tokens at one position, JSON-able."""
        return {
            self.piece(t): {"id": t, "ranks": self.ranks(t, pos), "logits": [round(x, 3) for x in self.logits(t, pos)]}
            for t in tokens
        }

    def first_layer_in_top(self, token: int, k: int = 10, pos: int = -1) -> int | None:
        """The first layer at which `token` is among the k highest lens logits, or None."""
        return next((L for L, r in enumerate(self.ranks(token, pos)) if r < k), None)


def logit_lens(run: Any, kind: str = "resid_out", positions=None) -> LogitLens:
    """Read each layer's `kind` capture through the final norm and unembedding of `run` (a
    labkit.captures.Run, which calls this as Run.logit_lens).

    positions: None (every position the captures hold), an int, or a list of ints."""
    if run.unembed is None:
        raise InvalidArgumentError(
            "this run has no unembedding: make it through a lab (lab.run, lab.reference, labkit.load_dumps)"
        )
    stages = [s for s in run.stages if s.startswith("blk.") and s.split(".", 2)[2] == kind]
    if not stages or any(s not in run for s in stages):
        raise UnknownStageError(f"the logit lens needs {kind!r} of every layer captured in this run")
    held = run.rows(stages[0])
    T = len(run.tokens)
    want = held if positions is None else [positions] if isinstance(positions, int) else list(positions)
    want = tuple(p if p >= 0 else T + p for p in want)
    if any(p not in held for p in want):
        raise InvalidArgumentError(f"the captures hold positions {list(held)}; asked for {list(want)}")
    vocab = run.unembed(np.zeros((0, run[stages[0]].shape[-1]))).shape[-1]
    if len(stages) * len(want) * vocab * 4 > MAX_LENS_BYTES:
        raise InvalidArgumentError(
            f"a lens of {len(stages)} layers × {len(want)} positions × {vocab} tokens is over "
            f"{MAX_LENS_BYTES >> 20} MiB: pass positions= (e.g. positions=-1)"
        )
    hidden = np.stack([run.at(s, p) for s in stages for p in want])  # row i: layer i // P, position i % P
    Z = unembed_in_calls(run.unembed, hidden, vocab).reshape(len(stages), len(want), vocab)
    tokens = [run.tokens[p] for p in want]
    return LogitLens(run.model, run.engine, dict(run.variants), stages, want, tokens, Z, run.piece or str, T)


def unembed_in_calls(unembed: Callable[[np.ndarray], np.ndarray], hidden: np.ndarray, vocab: int) -> np.ndarray:
    """float32 logits of every row of `hidden`, in as few unembedding calls as CALL_BYTES allows:
    each call reads (and, from a float32 weight cache, widens) the whole unembedding once, so a
    lens of Gemma 3's 18 layers made one call a layer cost 18 reads of its 262144-row table."""
    Z = np.empty((len(hidden), vocab), np.float32)
    step = max(1, CALL_BYTES // (8 * vocab))
    for a in range(0, len(hidden), step):
        Z[a : a + step] = unembed(hidden[a : a + step])
    return Z
