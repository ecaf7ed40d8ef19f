"""Read a dumped tensor in the stage's labkit layout, whatever axis order its engine used.

A layout is a string of axis letters, slowest first:
  t positions, w features, h heads, d head_dim (features split per head),
  q query positions, k key positions (may be padded past T: llama.cpp pads its KV axis),
  b a batch of 1.
labkit's own layouts are `tw` for vectors ([positions, features]) and `hqk` for attention
maps ([heads, q_pos, k_pos]). An engine may use `thd` (TransformerLens' hook_q), `htd`
(transformers' q after its transpose), ggml's reversed order (`wt`, `dht`, `kqh`: numpy
shape == ggml's ne), `qhk`, and any of these with a batch of 1 in front.

`auto` tries every layout against the sizes the model and the tokens give. Axes of size 1
carry no order, so they are dropped first; readings that move the data identically are
one reading. A tensor holding one position where the tokens have T > 1 is the last
position only (llama.cpp prunes the last layer to the logits it was asked for). More than
one distinct reading is ambiguous unless the names preset's own layout settles it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from labkit.captures import is_attention_map, stage_kind
from labkit.errors import AmbiguousLayoutError, LayoutMismatchError
from labkit.model.config import ModelConfig

FLAT = ("tw", "wt")
HEADS = ("thd", "htd", "dht")
MAPS = ("hqk", "qhk", "kqh")
_CANONICAL = {"flat": "tw", "heads": "thd", "map": "hqk"}


@dataclass(frozen=True)
class Expect:
    """What a stage's tensor holds: T positions of `width` features (split as `heads` = (H, D)
    where the stage has heads), or an attention map over `n_heads`."""

    stage: str
    T: int
    width: int = 0
    heads: tuple[int, int] | None = None
    n_heads: int = 0
    n_past: int = 0  # positions cached before the pass: an attention map has n_past + T keys

    @property
    def keys(self) -> int:
        return self.n_past + self.T

    @property
    def family(self) -> str:
        return "map" if self.n_heads else ("heads" if self.heads else "flat")

    def layouts(self) -> tuple[str, ...]:
        return {"map": MAPS, "heads": FLAT + HEADS, "flat": FLAT}[self.family]

    def sizes(self, t: int) -> dict[str, int]:
        h, d = self.heads or (0, 0)
        return {"t": t, "q": t, "w": self.width, "h": self.n_heads or h, "d": d}

    def shapes(self) -> str:
        """The shapes people would write, for error messages."""
        s = self.sizes(self.T)
        shapes = [tuple(s.get(c, self.T) for c in lay) for lay in self.layouts()[:3]]
        return " or ".join(str(list(x)) for x in shapes)


def expect(stage: str, cfg: ModelConfig, T: int, width: int | None = None, n_past: int = 0) -> Expect:
    """The Expect of a stage of this model; `width` overrides it for a fused source tensor."""
    kind = stage_kind(stage)
    if is_attention_map(stage):
        return Expect(stage, T, n_heads=cfg.n_heads, n_past=n_past)
    q_heads, kv_heads = (cfg.n_heads, cfg.head_dim), (cfg.n_kv_heads, cfg.head_dim)
    table = {
        **dict.fromkeys(("q", "q_norm", "q_rope", "attn_ctx"), (cfg.q_dim, q_heads)),
        **dict.fromkeys(("k", "k_norm", "k_rope", "v"), (cfg.kv_dim, kv_heads)),
        **dict.fromkeys(("ffn_gate", "ffn_up", "ffn_act"), (cfg.d_ff, None)),
        **dict.fromkeys(("logits_raw", "logits"), (cfg.vocab_size, None)),
    }
    w, heads = table.get(kind, (cfg.d_model, None))
    if width is not None and width != w:
        w, heads = width, None
    return Expect(stage, T, w, heads)


@dataclass(frozen=True)
class Reading:
    """One way to read a tensor: its layout, how many positions it holds (T, or 1 = the last)."""

    layout: str
    t: int
    key: tuple  # the data movement it implies: two readings with the same key are the same

    def describe(self) -> str:
        return self.layout + (" (last position only)" if self.t == 1 else "")


def readings(shape: tuple[int, ...], e: Expect, only: str | None = None) -> list[Reading]:
    """Every distinct reading of an array of `shape` as `e` (restricted to layout `only`)."""
    squeezed = tuple(n for n in shape if n != 1)
    found: dict[tuple, Reading] = {}
    for layout in e.layouts():
        if only is not None and layout != only:
            continue
        for t in (e.T, 1) if e.T > 1 else (e.T,):
            r = _fit(layout, squeezed, e, t)
            if r is not None:
                found.setdefault(r.key, r)
    return list(found.values())


def _axes(layout: str, squeezed: tuple[int, ...], e: Expect, t: int) -> dict[str, int] | None:
    """{letter: size} of every letter of `layout` when it fits the squeezed shape, else None.
    Letters of size 1 were squeezed out; the key axis takes whatever size it has (>= t)."""
    sizes = e.sizes(t)
    letters = [c for c in layout if c == "k" or sizes[c] != 1]
    if len(letters) == len(squeezed) + 1 and "k" in letters:
        letters.remove("k")  # a key axis of 1 (one position, nothing padded)
    if len(letters) != len(squeezed):
        return None
    got = dict(zip(letters, squeezed))
    if any(c != "k" and got[c] != sizes[c] for c in letters) or got.get("k", e.keys) < e.keys:
        return None
    return {c: got.get(c, 1 if c == "k" else sizes[c]) for c in layout}


def _fit(layout: str, squeezed: tuple[int, ...], e: Expect, t: int) -> Reading | None:
    axes = _axes(layout, squeezed, e, t)
    return None if axes is None else Reading(layout, t, _key(layout, axes, e, t))


def _key(layout: str, axes: dict[str, int], e: Expect, t: int) -> tuple:
    """(positions, canonical axes as (size, stride)) with size-1 axes dropped and contiguous
    neighbours merged: equal keys move the data identically."""
    stride, strides = 1, {}
    for c in reversed(layout):
        strides[c] = stride
        stride *= axes[c]
    if "w" in strides and e.heads:  # a flat reading of a stage with heads: w = (h, d)
        strides["h"], strides["d"] = strides["w"] * e.heads[1], strides["w"]
    sizes = {**e.sizes(t), **axes}
    canon = [(sizes[c], strides.get(c, 0)) for c in _CANONICAL[e.family] if sizes[c] != 1]
    merged: list[tuple[int, int]] = []
    for n, s in canon:
        if merged and merged[-1][1] == n * s:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    return (t, tuple(merged))


def choose(name: str, shape: tuple[int, ...], e: Expect, layout: str | None, prefer: tuple[str, ...]) -> Reading:
    """The one reading of a tensor, or a typed error naming the candidates or the expected shapes."""
    only = layout.replace("b", "") if layout else None
    if only is not None and only not in e.layouts():
        raise LayoutMismatchError(f"{e.stage} ({name}): layout {layout!r} does not apply; use one of {e.layouts()}")
    found = readings(shape, e, only)
    if not found:
        raise LayoutMismatchError(
            f"{e.stage} ({name}): shape {list(shape)} fits no layout for {e.T} tokens: expected {e.shapes()} "
            "(optionally with a batch of 1 in front, or one position: the last)"
        )
    if len(found) > 1:
        preferred = [r for r in found if r.layout in prefer and r.t == e.T]
        if len(preferred) == 1:
            return preferred[0]
        options = ", ".join(r.describe() for r in found)
        raise AmbiguousLayoutError(
            f"{e.stage} ({name}): shape {list(shape)} reads as {options}; choose with "
            f"layout={found[0].layout!r} or layout={{{name!r}: {found[0].layout!r}}}"
        )
    return found[0]


def apply(a: np.ndarray, r: Reading, e: Expect) -> np.ndarray:
    """The array in labkit's layout ([t, width] or [heads, q, T]), key axis cropped to T."""
    squeezed = tuple(n for n in a.shape if n != 1)
    axes = _axes(r.layout, squeezed, e, r.t)
    full = a.reshape([axes[c] for c in r.layout])
    canon = "tw" if "w" in r.layout else _CANONICAL[e.family]
    out = full.transpose([r.layout.index(c) for c in canon])
    if e.family == "map":
        return np.ascontiguousarray(out[:, :, : e.keys])
    return np.ascontiguousarray(out.reshape(r.t, -1))


def layout_for(name: str, stage: str, layout: str | dict[str, str]) -> str | None:
    """The layout the caller chose for a tensor (by its name or its stage, globs allowed), or None (auto)."""
    if isinstance(layout, str):
        return None if layout == "auto" else layout
    for pattern, lay in layout.items():
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(stage, pattern):
            return None if lay == "auto" else lay
    return None
