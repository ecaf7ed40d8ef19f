"""What a caller asks of one GPU pass, and what passes of one sequence carry from one to the next.

A `PassRequest` is built once, where a pass is asked for (`Lab.run`, `Lab.generate`, a case), and
read by the executor: the new tokens, what to capture and read back, patches, and what the pass may
take over from earlier ones (labkit.gpu.reuse). A `PassState` is a sequence's: its KV cache (so its
position) and its compiled decode step (labkit.gpu.compiled_step), which binds that cache. A pass
reads its request and advances its state; the serving paths fork, chunk and batch states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.reuse import FRESH, Reuse

if TYPE_CHECKING:
    from labkit.gpu.compiled_step import CompiledStep

Patch = Callable[[np.ndarray, str], np.ndarray]  # (the stage's array, its name) -> the array written back


@dataclass(frozen=True)
class PassRequest:
    """One forward pass of `ids`, as asked.

    `names`: the stages read back (None: all); `positions` (0-based in `ids`): captures hold only
    those rows (query rows of attention maps); `heads`: attention maps hold only those heads.
    `last_logits_only`: the unembedding runs for the last position only (also done when nothing
    reads the other positions' logits). `stepped`: one submit per stage; `debug`: every region
    poisoned first, poison left counted; `patch`: {stage: fn(array, stage) -> array} applied on
    the host after that stage and written back."""

    ids: tuple[int, ...]
    names: tuple[str, ...] | None = None
    positions: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    last_logits_only: bool = False
    debug: bool = False
    stepped: bool = False
    timestamps: bool = False
    patch: Mapping[str, Patch] = field(default_factory=dict)
    reuse: Reuse = FRESH
    # "greedy": the pass ends with the next token picked on the device (a `next_token` stage, labkit.ops.argmax),
    # read back as captures["next_token"] (one id a position) in place of rows of logits
    pick: str | None = None

    def __post_init__(self):
        for name in ("ids", "names", "positions", "heads"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "patch", dict(self.patch or {}))

    @property
    def T(self) -> int:
        return len(self.ids)


@dataclass
class PassState:
    """A sequence's state on the GPU: its KV cache (its position is `kv.n_past`) and the compiled
    decode step that binds it, kept while it holds (labkit.gpu.compiled_step.CompiledSteps.get)."""

    kv: GpuKVCache
    step: CompiledStep | None = None

    @property
    def n_past(self) -> int:
        return self.kv.n_past


@dataclass
class BatchState:
    """A batch's sequences on the GPU: each one's state, and the compiled decode step that binds all
    their caches (labkit.gpu.compiled_step), kept while the same sequences step together."""

    states: list[PassState]
    step: CompiledStep | None = None
