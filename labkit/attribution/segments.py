"""Which stages to recompute to check one captured stage: the stage and the uncaptured ones
between it and the nearest captured stages.

An engine's dumps rarely hold every stage (a forward hook sees no roped q or attention
probabilities), so a captured stage whose inputs were not captured is checked together
with the stages that lead to it from captured ones: a segment, `blk.0.q_rope … blk.0.attn_out`.
Attention reads the layer's KV cache, so the stages that write it count as inputs too.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from labkit.model.graph import Stage


@dataclass(frozen=True)
class Segment:
    """`stages` in graph order, ending with the captured `stage`; `inputs` are the captured stages read."""

    stage: str
    stages: tuple[str, ...]
    inputs: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.stage if len(self.stages) == 1 else f"{self.stages[0]} … {self.stage}"


def kv_writers(graph: list[Stage]) -> dict[tuple[int, str], str]:
    """(layer, "k" or "v") → the stage whose output is that layer's cache."""
    return {(st.layer, st.kv_write): st.name for st in graph if st.kv_write}


def dependencies(st: Stage, writers: dict[tuple[int, str], str]) -> list[str]:
    """What a stage reads: its inputs, and the stages that write the caches it reads."""
    return [*st.inputs, *(writers[(st.layer, kind)] for kind in st.kv_read)]


def segment_of(stage: str, graph: list[Stage], available: Collection[str]) -> Segment:
    """The segment that checks `stage` from the `available` (captured, whole) stages."""
    by_name = {st.name: st for st in graph}
    order = {st.name: i for i, st in enumerate(graph)}
    writers = kv_writers(graph)
    todo, seen, inputs = [stage], {stage}, set()
    while todo:
        for dep in dependencies(by_name[todo.pop()], writers):
            if dep in seen:
                continue
            seen.add(dep)
            if dep in available:
                inputs.add(dep)
            else:
                todo.append(dep)
    computed = sorted(seen - inputs, key=order.__getitem__)
    return Segment(stage, tuple(computed), tuple(sorted(inputs, key=order.__getitem__)))
