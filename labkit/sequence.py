"""A sequence computed so far and kept to continue (a prefix cache, a verifier's base), and the passes
that continue one: in one pass, or as micro-batches of `ubatch` tokens (labkit.chunks).

A `SequenceState` holds one engine's memory of the sequence: the reference's `KVCache` (keys, values,
recurrent states as float64 arrays) or the GPU's `PassState` (buffers). Continuing it advances it,
as an engine's sequence advances; `fork()` keeps a copy for another continuation. A state made
under one model, engine or kernel selection is refused by another: its cache holds that one's
numbers."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit.chunks import run_chunked
from labkit.errors import InvalidArgumentError, PromptTooLongError
from labkit.model.reference import KVCache


@dataclass
class SequenceState:
    """What `lab.prefill` returns: the tokens so far and the engine's cache of them."""

    engine: str  # "gpu" or "reference"
    model: str
    tokens: list[int]
    held: Any  # KVCache (reference) or labkit.gpu.pass_request.PassState (gpu)
    capacity: int  # positions the cache holds at most (the GPU's buffers; the context for the reference)
    variants: dict[str, str] = field(default_factory=dict)  # the kernel selection its GPU cache was made under
    device: Any = field(default=None, repr=False)
    broken: str = ""  # why it cannot be continued: a continuation failed midway, its cache part-written
    kv_types: str = "f32"  # the KV cache's types it was made on (labkit.model.cache_stages.CacheTypes)

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def fork(self) -> SequenceState:
        """An independent copy: continuing one leaves the other as it was."""
        if self.broken:
            raise InvalidArgumentError(f"this state cannot be forked ({self.broken}): prefill again")
        if self.engine == "reference":
            held = copy.deepcopy(self.held)
        else:
            from labkit.gpu.pass_request import PassState

            held = PassState(self.held.kv.fork(self.device))
        return SequenceState(self.engine, self.model, list(self.tokens), held, self.capacity, dict(self.variants),
                             self.device, kv_types=self.kv_types)  # fmt: skip

    @property
    def cached(self) -> int:
        """The positions its cache holds (its tokens', unless a continuation failed midway)."""
        return self.held.n_past

    def check_continues(self, engine: str, model: str, variants: dict[str, str], n_new: int,
                        kv_types: str = "f32") -> None:  # fmt: skip
        """Refuse a continuation this state cannot give, before any work."""
        if self.broken or self.cached != self.n_past:
            why = self.broken or f"its cache holds {self.cached} positions, its tokens {self.n_past}"
            raise InvalidArgumentError(f"this state cannot be continued ({why}): prefill again, or continue a fork")
        if self.model != model:
            raise InvalidArgumentError(f"this state is {self.model}'s sequence; the lab is {model}")
        if self.engine != engine:
            raise InvalidArgumentError(f"this state is the {self.engine} engine's cache; continue it with that engine")
        if self.kv_types != kv_types:
            raise InvalidArgumentError(
                f"this state's cache is {self.kv_types}; the lab keeps {kv_types} (labkit.open(..., kv_type=)): "
                "prefill on this lab"
            )
        if engine == "gpu" and self.variants != variants:
            raise InvalidArgumentError(
                f"this state's cache was computed under the kernels {self.variants or 'default'}; the lab now selects "
                f"{variants or 'default'}: prefill again, or switch back"
            )
        if self.n_past + n_new > self.capacity:
            raise PromptTooLongError(
                f"the state holds {self.capacity} positions; {self.n_past} + {n_new} new tokens do not fit "
                "(lab.prefill(..., room=N) keeps room for N more)"
            )


def reference_pass(engine: Any, ids: list[int], cache: KVCache, names: list[str] | None, ubatch: int | None
                   ) -> dict[str, np.ndarray]:  # fmt: skip
    """The reference's captures of `ids` after what `cache` holds, in one pass or in micro-batches."""
    if ubatch is None or ubatch >= len(ids):
        return engine.forward(ids, cache, capture=names)
    return run_chunked(ids, ubatch, lambda chunk: engine.forward(chunk, cache, capture=names), cache.n_past)


def path_name(n_past: int, ubatch: int | None, n_tokens: int, verify: bool = False) -> str:
    """How a run was computed, as `Run.path` says it: "one-shot", "ubatch=7", "prefix=5", "verify=4"."""
    parts = [f"prefix={n_past}"] if n_past and not verify else []
    if verify:
        parts.append(f"verify={n_tokens}")
    if ubatch is not None and ubatch < n_tokens:
        parts.append(f"ubatch={ubatch}")
    return ",".join(parts) or "one-shot"


class continuing:
    """`with continuing(state, ids):` a continuation's passes; after them the state holds the new
    tokens, or, when a pass raised (a Ctrl-C too), says it is broken: its cache is part-written."""

    def __init__(self, state: SequenceState | None, ids: list[int]) -> None:
        self.state, self.ids = state, ids

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, _tb: Any) -> None:
        if self.state is None:
            return
        if kind is None:
            self.state.tokens.extend(self.ids)
        else:
            self.state.broken = f"a continuation of {len(self.ids)} tokens failed midway: {kind.__name__}"
