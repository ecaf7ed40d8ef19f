"""Stepped execution: one stage per submit, its output read back at once.

Same plan and kernels as the batched pass, so `st[name]` equals the batched
capture bit for bit (tests check this); useful to watch a pass unfold.
Stages the plan skips (attention scores and probabilities under a fused attn_ctx
variant such as "streaming") are never run nor read back: asking for one is an
UnknownStageError, never an array of zeros the GPU did not compute.
"""

from __future__ import annotations

import numpy as np

from labkit.errors import UnknownStageError
from labkit.gpu.executor import (
    GpuExecutor,
    GpuKVCache,
    StagePlan,
    record_stage,
)
from labkit.gpu.readback import Readback


class Stepper:
    def __init__(self, executor: GpuExecutor, ids: list[int], kv: GpuKVCache):
        self.executor, self.ids, self.kv = executor, list(ids), kv
        self.plans = executor.plan(ids, kv)
        self.index = 0
        self.captures: dict[str, np.ndarray] = {}
        self._current: str | None = None
        self._skip()

    @property
    def stages(self) -> list[str]:
        """Every stage of the graph, in order (skipped ones included; see `skipped`)."""
        return [p.stage.name for p in self.plans]

    @property
    def skipped(self) -> list[str]:
        """Stages the selected variants do not compute (scores/probs under fused attention)."""
        return [p.stage.name for p in self.plans if p.skipped]

    @property
    def done(self) -> bool:
        return self.index >= len(self.plans)

    @property
    def current(self) -> str | None:
        """The last stage executed (None before the first)."""
        return self._current

    @property
    def next_stage(self) -> str | None:
        return None if self.done else self.plans[self.index].stage.name

    def _skip(self) -> None:
        """Move past stages the plan does not compute; the pass is complete after the last stage."""
        while not self.done and self.plans[self.index].skipped:
            self.index += 1

    def next(self) -> str:
        """Run the next computed stage, read its output back; returns its name."""
        if self.done:
            raise StopIteration("all stages have run")
        p = self.plans[self.index]
        dev = self.executor.device
        enc = dev.create_command_encoder()
        record_stage(enc, p)
        readback = Readback(dev, [p], len(self.ids))
        readback.record(enc)
        dev.queue.submit([enc.finish()])
        self.captures.update(readback.read()[0])
        self.index += 1
        self._current = p.stage.name
        self._skip()
        if self.done:
            self.kv.advance(len(self.ids))
        return p.stage.name

    def _not_computed(self, p: StagePlan) -> UnknownStageError:
        """Name the computed stage whose kernel does without this one (through skipped consumers)."""
        chain, reader = {p.stage.name}, None
        for q in self.plans:
            if chain & set(q.stage.inputs):
                if not q.skipped:
                    reader = q.stage
                    break
                chain.add(q.stage.name)
        by = ""
        if reader is not None:
            k = self.executor.kernel(reader)
            by = f" ({reader.name} runs {k.family}/{k.name}, a fused kernel that does not read it)"
        return UnknownStageError(f"stage {p.stage.name!r} is not computed: no later stage reads it{by}")

    def _plan(self, name: str) -> StagePlan:
        for p in self.plans:
            if p.stage.name == name:
                if p.skipped:
                    raise self._not_computed(p)
                return p
        raise UnknownStageError(f"unknown stage {name!r}")

    def run_to(self, name: str) -> np.ndarray:
        """Run stages up to and including `name`; returns its output."""
        self._plan(name)
        while name not in self.captures:
            self.next()
        return self.captures[name]

    def run_all(self) -> dict[str, np.ndarray]:
        while not self.done:
            self.next()
        return self.captures

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.captures:
            self._plan(name)
            raise UnknownStageError(f"stage {name!r} has not run yet (current: {self.current})")
        return self.captures[name]

    def __iter__(self):
        while not self.done:
            yield self.next()

    def __repr__(self) -> str:
        return f"Stepper({self.index}/{len(self.plans)} stages, current={self.current!r})"
