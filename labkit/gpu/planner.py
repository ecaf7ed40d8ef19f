"""The planner: one loop over the graph that turns a pass of new tokens into stage plans.

For each stage it builds a `StageContext` (what the stage's op `plan` sees) and calls the op
module's `plan`, which returns the stage's output region and the dispatches to record. Around that
loop: stages nothing reads are skipped, uncaptured stages take scratch regions (labkit.gpu.scratch),
a streamed pass marks where its segments end, a long captured unembedding runs in token chunks
(labkit.gpu.chunked_logits), a rerun keeps the stages before the first changed signature, and a
decode step's matmuls may fuse their epilogues (labkit.gpu.fusion). A decode step is planned here
only to be compiled (labkit.gpu.compiled_step). Submitting the plans is the submitter's job
(labkit.gpu.submitter); choosing kernels, kernel_selection's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from labkit.gpu.allocator import Allocator
from labkit.gpu.batch_plan import plan_segments
from labkit.gpu.chunked_logits import LogitsChunk, token_spans
from labkit.gpu.fusion import epilogue_for
from labkit.gpu.kernel_selection import reads
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import Region, StagePlan
from labkit.gpu.reuse import Reuse
from labkit.gpu.scratch import ScratchPool
from labkit.gpu.stage_context import PassScope, StageContext
from labkit.model.graph import Stage
from labkit.model.liveness import last_readers
from labkit.ops import OPS


def plan_pass(
    ex: Any,
    ids: Sequence[int],
    kv: GpuKVCache,
    objects: Allocator,
    last_logits_only: bool = False,
    reuse: list[StagePlan] | None = None,
    start: int = 0,
    keep: set[str] | None = None,
    streamed: set[str] | None = None,
    fuse: bool = False,
    keys_room: int = 0,
    segments: list | None = None,
    extra: tuple[Stage, ...] = (),
) -> list[StagePlan]:
    """Regions and dispatches for the new tokens `ids` after kv.n_past cached ones, every GPU object
    from `objects` (labkit.gpu.allocator).

    With `reuse`, stages before `start` keep their regions (and data) and get no dispatches.
    With `keep`, only those stages get regions of their own; the others get scratch regions
    (labkit.gpu.scratch), free again once their last reader is recorded. With `streamed` (the
    captured stages of a streamed pass; keep is then empty), captured regions are held until
    their segment ends (`StagePlan.segment_end`), where the pass reads them back. `fuse`: a decode
    step's matmuls fuse their epilogues (labkit.gpu.fusion), as a compiled step's do. `keys_room`:
    attention maps are allocated for that many keys (a compiled step's, so that no region moves).
    `segments`: the sequences of a batch packed in `ids` (labkit.gpu.batch_plan); `kv` is then the first's.
    `extra`: stages after the graph's, for this pass only (a greedy step's next_token), each on a region of its own."""
    sel = ex.selection()
    kernels, skipped = sel.kernels, sel.skipped
    scratch = None
    if keep is not None:
        readers = last_readers(ex.graph, lambda st: reads(st, kernels[st.name]), skipped)
        scratch = ScratchPool(partial(_buffer, ex, objects), readers, keep, round_below=ex.binding_limit,
                              streamed=streamed)  # fmt: skip
    epilogues = _epilogues(ex.graph, sel, len(ids)) if fuse else None
    scope = PassScope(
        {}, kv, ids, last_logits_only, objects, scratch, {}, epilogues, keys_room, segments
    )  # its dicts fill as it plans
    plans: list[StagePlan] = []
    for i in range(len(ex.graph)):
        st = ex.graph[i]
        if reuse is not None and i < start:
            old = reuse[i]
            plans.append(StagePlan(st, old.out, [], old.signature, old.skipped))
        else:
            chunked = i == len(ex.graph) - 1 and _logits_in_chunks(st, len(ids), last_logits_only, streamed)
            plans.append(_stage_plan(ex, sel, i, scope, chunked))
        scope.regions[st.name] = plans[-1].out
        scope.fused.update(plans[-1].also_writes)
        if scratch is not None:
            plans[-1].segment_end = scratch.recorded(i, st.name, 4 * plans[-1].out.size)
    if plans and streamed:
        plans[-1].segment_end = True  # the last captures are read after the last stage
    return plans + _plan_extra(ex, scope, extra)


def _plan_extra(ex: Any, scope: PassScope, extra: tuple[Stage, ...]) -> list[StagePlan]:
    """The plans of stages after the graph's, each on a region of its own (a scratch region may be the one
    its input just left)."""
    own, plans = replace(scope, scratch=None), []
    for st in extra:
        ctx = StageContext(ex, st, ex.kernel(st), own)
        out = OPS[st.op].plan(st, ctx)
        scope.objects.stage_done()
        plans.append(StagePlan(st, out, ctx.dispatches))
        scope.regions[st.name] = out
    return plans


def _buffer(ex: Any, objects: Allocator, n_floats: int, label: str):
    return ex.buffer(n_floats, label, objects)


def _stage_plan(ex: Any, sel, i: int, scope: PassScope, chunked: bool = False) -> StagePlan:
    """Stage i's plan, fused with the next stage's epilogue where the pass fuses (`PassScope.epilogues`)."""
    st = ex.graph[i]
    ep = scope.epilogues[i] if scope.epilogues is not None else None
    if scope.segments is not None and st.name in ex.per_sequence:
        return plan_segments(ex, st, sel.kernels[st.name], scope, sel.signatures[i])
    ctx = StageContext(ex, st, sel.kernels[st.name], scope, ep)
    if chunked:
        return _plan_logits_chunks(ex, ctx, sel.signatures[i])
    return _plan_stage(ex, ctx, sel.signatures[i], st.name in sel.skipped, scope.fused.get(st.name))


_EPILOGUES: dict[int, tuple] = {}  # id(selection) -> (selection, T, each stage's epilogue): one per step shape


def _epilogues(graph: list[Stage], sel, T: int) -> list:
    """Each stage's fused epilogue (labkit.gpu.fusion) under a selection, worked out once per
    selection and token count, not per stage per decode step."""
    held = _EPILOGUES.get(id(sel))
    if held is None or held[0] is not sel or held[1] != T:
        if len(_EPILOGUES) > 8:
            _EPILOGUES.clear()
        held = _EPILOGUES[id(sel)] = (sel, T, [epilogue_for(graph, i, sel.kernels, T) for i in range(len(graph))])
    return held[2]


def _plan_stage(ex: Any, ctx: StageContext, signature: tuple, skipped: bool, fused=None) -> StagePlan:
    """One stage's regions and dispatches; a skipped stage gets a placeholder buffer, never
    dispatched and never captured; a `fused` one, the region an earlier stage's kernel writes, and
    no dispatch."""
    st = ctx.stage
    if skipped:
        placeholder = ex.buffer(4, st.name + ".skipped", ctx.objects)
        return StagePlan(st, Region(placeholder, 0, (0,)), [], signature, True)
    if fused is not None:
        return StagePlan(st, fused, [], signature)
    out = OPS[st.op].plan(st, ctx)
    ctx.objects.stage_done()  # its operand textures serve later stages once it is recorded
    return StagePlan(st, out, ctx.dispatches, signature, also_writes=ctx.also_writes, reads_ids=ctx.reads_ids)


def _logits_in_chunks(st: Stage, T: int, last_only: bool, streamed: set[str] | None) -> bool:
    """A streamed pass computes and reads its captured unembedding in token chunks when it is
    the last stage and bigger than one chunk (labkit.gpu.chunked_logits)."""
    if not streamed or st.name not in streamed or st.policy != "lm_head" or last_only:
        return False
    return len(token_spans(T, 4 * st.params["out"])) > 1


def _plan_logits_chunks(ex: Any, ctx: StageContext, signature: tuple) -> StagePlan:
    """The unembedding as token chunks over one region of the largest chunk's rows."""
    st, x, width = ctx.stage, ctx.input(0), ctx.stage.params["out"]
    spans = token_spans(ctx.T, 4 * width)
    out = ctx.output((max(n for _, n in spans), width))
    keep = ctx.policy("lm_head").window_filter
    chunks = []
    for t0, n in spans:
        rows = Region(out.buffer, out.offset, (n, width))
        chunks.append(LogitsChunk(t0, n, ex.matmul(ctx, x, rows, n, t0, keep)))
    ctx.objects.stage_done()
    return StagePlan(st, out, [], signature, chunks=chunks)


def plans_under(ex: Any, ids, kv: GpuKVCache, objects: Allocator, last_only: bool, reuse: Reuse, keep,
                streamed, extra: tuple[Stage, ...] = ()):  # fmt: skip
    """Plans of a pass under its reuse: a rerun keeps the previous pass's stages up to the first
    changed signature (when every stage of this pass has its own region too)."""
    if reuse.kind == "rerun" and keep is None:
        previous, new_sigs = reuse.previous, ex.selection().signatures
        # no switch since the last pass: recompute it all (same regions), don't replay old data
        start = next((i for i, (p, s) in enumerate(zip(previous.plans, new_sigs)) if p.signature != s), 0)
        return plan_pass(ex, ids, kv, objects, last_only, reuse=previous.plans, start=start, extra=extra), start
    return plan_pass(ex, ids, kv, objects, last_only, keep=keep, streamed=streamed, extra=extra), 0
