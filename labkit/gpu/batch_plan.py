"""A batch of sequences in one GPU pass: their tokens packed on one axis, as engines pack them.

The stages that treat each token alone run once over the packed rows, so the batch reads each
weight once. The stages that mix a sequence's tokens or read their positions (labkit.model.batch_stages)
run once per sequence: the op's own `plan`, through a `SegmentContext` that shows it that sequence's
rows, position and KV cache, so every kernel, variant and fault of a single pass runs in a batch
unchanged. A per-sequence stage's rows land in one packed region that later stages read whole; its
outputs that cannot be packed (attention maps, rows written into a sequence's own cache) are kept
per sequence (`StagePlan.parts`), and read back so."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from labkit.errors import GpuLimitError
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import Region, StagePlan
from labkit.gpu.stage_context import PassScope, StageContext
from labkit.model.graph import Stage
from labkit.ops import OPS
from labkit.ops.base import PassShape


@dataclass(frozen=True)
class Segment:
    """One sequence of a batch: its rows [start, start + T) of the packed tokens, and its cache."""

    kv: GpuKVCache
    start: int
    ids: tuple[int, ...]

    @property
    def T(self) -> int:
        return len(self.ids)


def segments_of(seqs: list[list[int]], kvs: list[GpuKVCache]) -> list[Segment]:
    out, start = [], 0
    for ids, kv in zip(seqs, kvs, strict=True):
        out.append(Segment(kv, start, tuple(ids)))
        start += len(ids)
    return out


def row_slice(region: Region, start: int, n: int) -> Region:
    """Rows [start, start + n) of a packed region, as a region of the same buffer."""
    row = math.prod(region.shape[1:])
    return Region(region.buffer, region.offset + start * row, (n, *region.shape[1:]), region.layout)


def bound(rows: Region) -> Region:
    """Rows further into a packed region as a region of their own: the buffer operand is bound from
    their first byte, (buffer, byte offset, bytes), so a kernel reads them from index 0 (kernels read
    their operands from a buffer's start; only the matmul takes offsets, and it is given `unbound`)."""
    return Region((rows.buffer, 4 * rows.offset, 4 * rows.size), 0, rows.shape, rows.layout)


def unbound(r: Region) -> Region:
    """A bound region back as the rows of its buffer."""
    if not isinstance(r.buffer, tuple):
        return r
    buf, offset, _ = r.buffer
    return Region(buf, offset // 4, r.shape, r.layout)


class SegmentContext(StageContext):
    """What a per-sequence stage's op `plan` sees for one sequence of the batch: that sequence's
    tokens, position and KV cache; its rows of packed inputs; its own part of per-sequence ones."""

    def __init__(self, ex, st: Stage, kernel, scope: PassScope, seg: Segment, k: int, packed: list):
        super().__init__(ex, st, kernel, replace(scope, kv=seg.kv, ids=seg.ids, scratch=None, epilogues=None))
        self.seg, self.k, self.packed, self.total = seg, k, packed, len(scope.ids)

    def input(self, i: int) -> Region:
        name = self.stage.inputs[i]
        parts = self.scope.parts.get(name)
        if parts is not None:
            return parts[self.k]
        return self._bound(row_slice(self.regions[name], self.seg.start, self.T))

    def output(self, shape: tuple[int, ...]) -> Region:
        """A row layout's rows of one region packed for the batch (made by the first sequence), or,
        for a cache writer's rows and an attention map, the sequence's own."""
        st = self.stage
        own = st.kv_write and st.kv_write not in self.kv.types
        if own or OPS[st.op].layout != "rows" or shape[0] != self.T:
            return super().output(shape)
        if not self.packed:
            whole = (self.total, *shape[1:])
            self.packed.append(self.ex.region(st, whole, PassShape(self.total, 0), self.objects))
        return self._bound(row_slice(self.packed[0], self.seg.start, self.T))

    def cache(self, kind: str):
        """The cache this sequence's stage reads: its own, or the one its `kv_sequence` policy names."""
        st = self.stage
        if st.kv_write == kind or "kv_sequence" not in OPS[st.op].policy_families(st):
            return super().cache(kind)
        rule = self.policy("kv_sequence").cache_of
        other = self.scope.segments[rule(self.k)].kv if rule is not None else self.kv
        own, self.kv = self.kv, other
        try:
            return super().cache(kind)
        finally:
            self.kv = own

    def _bound(self, rows: Region) -> Region:
        """Rows at a buffer's start as they are; rows further in, bound from their first byte."""
        if rows.offset == 0:
            return rows
        if (4 * rows.offset) % self.ex.gpu.device.limits["min-storage-buffer-offset-alignment"]:
            raise GpuLimitError(
                f"{self.stage.name}: a batch's rows of {rows.shape[1:]} floats start at byte {4 * rows.offset}, "
                "which this device cannot bind; run the sequences one by one"
            )
        return bound(rows)

    def matmul(self, x: Region, out: Region, rows_T: int, x_skip: int = 0, window_filter=None, epilogue=None) -> None:
        """The matmul takes offsets itself: the rows as they lie in their packed region."""
        super().matmul(unbound(x), unbound(out), rows_T, x_skip, window_filter, epilogue)


def plan_segments(ex, st: Stage, kernel, scope: PassScope, signature: tuple) -> StagePlan:
    """A per-sequence stage planned once for each sequence of the batch: one plan whose dispatches
    are every sequence's, its output the packed rows, or `parts`, one region per sequence."""
    packed: list[Region] = []
    parts, dispatches = [], []
    for k, seg in enumerate(scope.segments):
        ctx = SegmentContext(ex, st, kernel, scope, seg, k, packed)
        parts.append(OPS[st.op].plan(st, ctx))
        for d in ctx.dispatches:
            d.n_past = seg.kv.n_past  # a compiled step moves its words from its own sequence's position
        dispatches += ctx.dispatches
    scope.objects.stage_done()
    if packed and all(unbound(p).buffer is packed[0].buffer for p in parts):
        return StagePlan(st, packed[0], dispatches, signature)
    scope.parts[st.name] = parts
    return StagePlan(st, parts[0], dispatches, signature, parts=parts)


def part_plans(plan: StagePlan) -> list[StagePlan]:
    """A per-sequence stage's parts as plans of their own (named `name#k`), for the readback."""
    return [StagePlan(replace(plan.stage, name=f"{plan.stage.name}#{k}"), r, []) for k, r in enumerate(plan.parts)]
