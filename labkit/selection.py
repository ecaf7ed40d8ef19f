"""What a pass captures: stage names or globs, layers, and positions, checked against the graph.

A long prompt cannot capture everything (every stage of 1024 Gemma tokens is 2.9 GB, and its
[T, 262144] logits alone pass 2 GiB at 2048 tokens), so `lab.run` narrows the capture the way
TransformerLens' `names_filter` does, plus positions: "last", an int, a slice or a list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase

from labkit.errors import InvalidArgumentError, UnknownStageError
from labkit.model.graph import Stage

Positions = str | int | slice | Sequence[int] | None


def select_names(graph: list[Stage], names: Iterable[str] | None, layers: Iterable[int] | None) -> list[str] | None:
    """Stage names in graph order for names/globs ("blk.*.attn_out") and layers; None means all.

    `layers` keeps the stages of those layers and the stages outside any layer (embed, logits)."""
    if names is None and layers is None:
        return None
    known = [st.name for st in graph]
    picked = set(known)
    if names is not None:
        picked, unmatched = set(), []
        for pattern in [names] if isinstance(names, str) else names:
            hits = [n for n in known if fnmatchcase(n, pattern)]
            if not hits:
                unmatched.append(pattern)
            picked.update(hits)
        if unmatched:
            raise UnknownStageError(
                f"names filter has unknown stage(s): {', '.join(unmatched)} (matching no stage); stages are e.g. "
                f"{', '.join(known[:6])}, ... and globs such as 'blk.*.attn_out' work"
            )
    if layers is not None:
        keep = {int(L) for L in layers}
        bad = sorted(L for L in keep if not any(st.layer == L for st in graph))
        if bad:
            n = max((st.layer for st in graph if st.layer is not None), default=-1) + 1
            raise UnknownStageError(f"no layer {bad[0]}: the model has layers 0..{n - 1}")
        picked = {st.name for st in graph if st.name in picked and (st.layer is None or st.layer in keep)}
    return [n for n in known if n in picked]


def select_positions(T: int, positions: Positions) -> list[int] | None:
    """0-based positions of a T-token pass for "last", an int (negative counts from the end), a
    slice or a list; None means all."""
    if positions is None:
        return None
    if isinstance(positions, str):
        if positions != "last":
            raise InvalidArgumentError(f'positions must be "last", an int, a slice or a list, not {positions!r}')
        return [T - 1]
    if isinstance(positions, slice):
        out = list(range(T))[positions]
    else:
        raw = [positions] if isinstance(positions, int) else list(positions)
        out = []
        for p in raw:
            if not -T <= int(p) < T:
                raise InvalidArgumentError(f"position {p} is outside the prompt's {T} tokens")
            out.append(int(p) % T)
    if not out:
        raise InvalidArgumentError(f"positions {positions!r} select no position of the prompt's {T} tokens")
    return sorted(set(out))


def select_heads(n_heads: int, heads: Iterable[int] | int | None) -> list[int] | None:
    """Sorted head numbers (negative counts from the last head) of the attention maps to read
    back; None means every head."""
    if heads is None:
        return None
    raw = [heads] if isinstance(heads, int) else list(heads)
    bad = [h for h in raw if not -n_heads <= int(h) < n_heads]
    if bad or not raw:
        what = f"head {bad[0]} is outside" if bad else "heads=[] selects none of"
        raise InvalidArgumentError(f"{what} the model's {n_heads} attention heads (0..{n_heads - 1})")
    return sorted({int(h) % n_heads for h in raw})


LOGITS = ("all", "last")


@dataclass(frozen=True)
class Capture:
    """A capture policy: what one pass reads back (`lab.run(prompt, capture=...)`).

    names: stage names or globs; layers: those layers' stages (and embed, output_norm, logits);
    positions: "last", an int, a slice or a list (query rows of attention maps); heads: the
    attention-map heads kept (scores and probs); logits: "last" runs the unembedding for the last
    position only while the other stages keep every position. None: no narrowing."""

    names: Sequence[str] | str | None = None
    layers: Sequence[int] | None = None
    positions: Positions = None
    heads: Sequence[int] | int | None = None
    logits: str = "all"

    def __post_init__(self):
        if self.logits not in LOGITS:
            raise InvalidArgumentError(f'logits must be "all" or "last", not {self.logits!r}')

    @classmethod
    def of(cls, capture: Capture | str | Sequence[str] | dict | None) -> Capture:
        """A Capture from what `lab.run(capture=...)` accepts: a Capture, names/globs (a str or a
        list), or a dict of Capture's fields."""
        if capture is None:
            return cls()
        if isinstance(capture, Capture):
            return capture
        if isinstance(capture, dict):
            unknown = sorted(set(capture) - {f.name for f in fields(cls)})
            if unknown:
                raise InvalidArgumentError(
                    f"capture has unknown key(s) {', '.join(unknown)}; known: names, layers, positions, heads, logits"
                )
            return cls(**capture)
        return cls(names=capture)
