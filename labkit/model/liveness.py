"""Liveness over the stage graph: the last stage that reads each stage's output.

Both engines free what no later stage reads: the GPU executor hands a scratch region on
(labkit.gpu.scratch), the float64 reference drops an uncaptured output (labkit.model.reference),
and the memory plan (labkit.model.memory) counts only what is alive at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from labkit.model.graph import Stage


def last_readers(
    graph: list[Stage],
    reads: Callable[[Stage], Iterable[str]] = lambda st: st.inputs,
    skipped: set[str] = frozenset(),
) -> dict[str, int]:
    """{stage name: index of the last stage that reads its output}; a stage nobody reads is its own
    last reader (its output is free as soon as it is computed). `reads(stage)` names what a stage
    reads (by default all its inputs; a fused GPU kernel reads fewer); `skipped` stages read nothing."""
    last = {st.name: i for i, st in enumerate(graph)}
    for i, st in enumerate(graph):
        if st.name not in skipped:
            for name in reads(st):
                if name in last:
                    last[name] = i
    return last
