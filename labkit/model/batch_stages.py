"""Which stages of a graph a batch of sequences runs once per sequence, and which once for the batch.

A batch packs its sequences' tokens on one axis, as engines do (llama.cpp's ubatch, vLLM's
flattened tokens). A stage that treats each token alone (a norm, a matmul, an expert's FFN) runs
once over the packed rows, so each weight is read once for every sequence. A stage that mixes a
sequence's tokens or reads their positions runs once per sequence, on that sequence's rows, cache
and state: rope, the cache writers and readers, the attention maps, the recurrent layers. A stage
that reads the per-sequence outputs that cannot be packed (attention maps, states, rows written into
a sequence's own cache) is per sequence too. Both engines walk the graph by this one rule."""

from __future__ import annotations

from labkit.model.graph import Stage
from labkit.model.stage_kinds import BY_KIND, layout_of
from labkit.ops import OPS


def output_layout(st: Stage) -> str:
    """How a stage's output lies: "rows", "ids", "heads" or "state"."""
    return layout_of(st.kind) if st.kind in BY_KIND else OPS[st.op].layout


def per_sequence(graph: list[Stage]) -> frozenset[str]:
    """The stages a batch runs once per sequence (the module docstring's rule)."""
    out: set[str] = set()
    unpacked: set[str] = set()  # per-sequence outputs that are not rows of the packed token axis
    for st in graph:
        mixes = bool(st.kv_read or st.kv_write or st.state) or OPS[st.op].per_sequence
        if mixes or output_layout(st) in ("heads", "state") or unpacked & set(st.inputs):
            out.add(st.name)
            if st.kv_write or output_layout(st) in ("heads", "state"):
                unpacked.add(st.name)
    return frozenset(out)
