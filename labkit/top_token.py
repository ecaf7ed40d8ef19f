"""One of the most probable next tokens: what `run.top(k)` and the logit lens list."""

from __future__ import annotations

from typing import NamedTuple


class TopToken(NamedTuple):
    """One of `run.top(k)`: indexable and unpackable (`piece, id, logit, prob = t`), named too."""

    piece: str
    id: int
    logit: float
    prob: float
