"""A prompt computed as micro-batches (llama.cpp's `n_ubatch`, vLLM's chunked prefill), each pass
continuing the cache the ones before it left, and its captures put back together as one prompt
pass's: so a chunked run compares with the one-shot pass stage by stage, position by position.

A chunk's rows are its own positions; its attention maps hold its queries against every key cached
so far, so a map is padded with the later keys, masked (-inf scores, 0 probabilities), as the
one-shot pass's causal mask leaves them. A recurrent state is the last chunk's: the state after the
whole prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from labkit.errors import InvalidArgumentError
from labkit.model.stage_kinds import layout_of, stage_kind


def chunk_spans(n_tokens: int, ubatch: int) -> list[tuple[int, int]]:
    """[start, end) of each micro-batch of at most `ubatch` tokens."""
    if not isinstance(ubatch, int) or isinstance(ubatch, bool) or ubatch < 1:
        raise InvalidArgumentError(f"ubatch={ubatch!r}: give a micro-batch of at least one token")
    return [(s, min(s + ubatch, n_tokens)) for s in range(0, n_tokens, ubatch)]


def run_chunked(ids: Sequence[int], ubatch: int, one_pass: Callable[[list[int]], dict[str, np.ndarray]],
                n_past: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    """`one_pass(chunk)` for each micro-batch in order (it continues its own cache, which held
    `n_past` positions before the first), the captures merged."""
    parts = [one_pass(list(ids[s:e])) for s, e in chunk_spans(len(ids), ubatch)]
    return parts[0] if len(parts) == 1 else merge_chunks(parts, n_past + len(ids))


def merge_chunks(parts: list[dict[str, np.ndarray]], n_keys: int) -> dict[str, np.ndarray]:
    """The captures of consecutive passes as one pass's; attention maps widened to `n_keys` keys (the
    positions cached before the first pass and every pass's)."""
    out: dict[str, np.ndarray] = {}
    for name in [n for n in parts[0] if all(n in p for p in parts)]:  # a stage every pass captured
        arrays = [p[name] for p in parts]
        layout = layout_of(stage_kind(name))
        if layout == "state":
            out[name] = arrays[-1]
        elif layout == "heads":
            out[name] = np.concatenate([_pad_keys(a, n_keys, stage_kind(name)) for a in arrays], axis=1)
        else:
            out[name] = np.concatenate(arrays, axis=0)
    return out


def _pad_keys(a: np.ndarray, n_keys: int, kind: str) -> np.ndarray:
    """An attention map [heads, queries, keys so far] widened to every key of the prompt, the keys
    after the chunk masked as the causal mask masks them."""
    fill = 0.0 if kind == "attn_probs" else -np.inf
    pad = np.full((*a.shape[:2], n_keys - a.shape[2]), fill, dtype=a.dtype)
    return np.concatenate([a, pad], axis=2)


def summed_per_stage(parts: list[dict[str, float]]) -> dict[str, float]:
    """Per-stage numbers over the passes, added (debug mode's unwritten elements, GPU milliseconds)."""
    out: dict[str, float] = {}
    for part in parts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + n
    return out


def merged_timings(results: list) -> dict:
    """The passes' timings added up (seconds, and each stage's GPU milliseconds under `stage_ms`), with
    how many passes there were."""
    timings: dict = {"passes": len(results)}
    for r in results:
        for key, value in r.timings.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                timings[key] = timings.get(key, 0) + value
    stage_ms = summed_per_stage([r.stage_ms or {} for r in results])
    if stage_ms:
        timings["stage_ms"] = stage_ms
    return timings
