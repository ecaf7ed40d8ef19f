"""Step refresh: a kept decode-step stage plan moved to the next position without planning it again.

A decode step's rope, attention and KV-writing stages read the step's position, and a softmax reads
an attention map one key longer each step, so step replay (labkit.gpu.replay) cannot hand their
last plans back verbatim. But from one step to the next such a stage keeps its pipeline, the
buffers it binds (the KV cache, an attention map's power-of-two buffer) and its uniform slot; what
moves is its uniform bytes and its workgroup count. Planning it afresh cost about 100 us of Python
a stage (Gemma 3 270M: 90 such stages, 9 ms of a step's 15 ms of planning).

The V projection of a decode step writes the cache at its position too: its matmul keeps its
dispatch (the weight, X and the cache bound whole) and moves its uniform's y_offset; the fill of
its X texture, from the same rows every step, is kept as it is.

`refresh` runs the op's own `plan` against a `RefreshContext`: the stage context with the kept
plan's output buffer, whose `dispatch` and `matmul` hand out the kept dispatches (`KeptDispatches`)
with new uniform slots and workgroup counts instead of building new ones. So the values are the
op's own, from one implementation (labkit.gpu.matmul's for a matmul). Anything that would need a
new object (a bigger buffer, other operands, another pipeline, a texture fill of other rows, a fused
next stage, a bias's product) raises `Replan`, and the stage is planned afresh.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.gpu.dispatch import Dispatch
from labkit.gpu.pass_plan import Region, StagePlan
from labkit.gpu.plan_cache import UniformArena
from labkit.gpu.stage_context import StageContext
from labkit.gpu.texture import bind_operands
from labkit.ops import OPS


class Replan(Exception):
    """The kept plan does not carry over to this step: plan the stage afresh."""


class KeptDispatches:
    """A kept plan's dispatches handed out in order, each over the same pipeline and operands, with
    its uniform slot rewritten and its new workgroup count (labkit.gpu.matmul.NewDispatches' methods)."""

    def __init__(self, old: StagePlan, arena: UniformArena):
        self.old, self.arena, self.taken = old.dispatches, arena, 0

    def dispatch(self, gpu: Any, pipeline: Any, buffers: list, data: bytes, workgroups: tuple, label: str = "",
                 tables: Any = None, after: tuple = ()) -> Dispatch:  # fmt: skip
        if self.taken >= len(self.old):
            raise Replan
        old = self.old[self.taken]
        if not old.resources or old.resources[:-1] != (*buffers, *after) or old.pipeline is not pipeline:
            raise Replan  # planned outside a step, or over other operands or another kernel
        buf, offset, size = old.resources[-1]
        if buf is not self.arena.buffer or size != len(data):
            raise Replan  # its uniform is not a slot of this step's arena, of this size
        self.arena.write(offset, data)
        self.taken += 1
        return Dispatch(old.pipeline, old.bind_group, workgroups, old.label, old.tables, old.resources)

    def fill(self, gpu: Any, rows: Any, label: str) -> tuple[Any, Dispatch]:
        """The kept fill of the same rows (a matmul's X: the same region every step), and its texture."""
        old = self.old[self.taken] if self.taken < len(self.old) else None
        if old is None or old.filled[:1] != (rows,):
            raise Replan  # other rows: a fill of them makes a texture
        self.taken += 1
        return old.filled[1], old


class RefreshContext(StageContext):
    """A stage context over a kept plan: its output buffer, and its dispatches with new uniforms and
    workgroup counts. What a refresh cannot keep raises Replan."""

    def __init__(self, ex: Any, st, kernel, regions: dict, cache, ids, last_only, epilogue, old: StagePlan, arena):
        super().__init__(ex, st, kernel, regions, cache, ids, last_only, epilogue=epilogue)
        self.old, self.kept = old, KeptDispatches(old, arena)

    def output(self, shape: tuple[int, ...]) -> Region:
        if self.stage.kv_write:  # the cache at n_past: no new object
            return super().output(shape)
        out = self.old.out
        if out.offset != 0 or 4 * math.prod(shape) > out.buffer.size:
            raise Replan  # an attention map outgrew its buffer
        return Region(out.buffer, 0, shape, out.layout)

    def dispatch(self, operands: list, values: dict, workgroups: int) -> None:
        st = self.stage
        bound, fills = bind_operands(self.ex.gpu, self.kernel.source(self.shape), operands, st.name)
        if fills:
            raise Replan
        d = self.ex.dispatch(st, OPS[st.op], self.kernel, self.shape, bound, values, workgroups, make=self.kept)
        self.dispatches.append(d)

    def matmul(self, x: Region, out: Region, rows_T: int, x_skip: int = 0, window_filter=None,
               epilogue: tuple[str, list, dict] | None = None) -> None:  # fmt: skip
        self.dispatches += self.ex.matmul(self, x, out, rows_T, x_skip, window_filter, epilogue, make=self.kept)

    def fused_next(self, shape: tuple[int, ...]):
        if self.epilogue is None:
            return None  # nothing fuses into this stage
        raise Replan  # the fused stage's region is a new object

    def _replan(self, *args, **kwargs):
        raise Replan

    temp = dispatch_op = token_rows = experts = _replan


def refresh(ex: Any, st, kernel, regions: dict, cache, ids, last_only, epilogue, old: StagePlan, arena: UniformArena):
    """Stage `st`'s kept plan `old` moved to this step, or None when it must be planned afresh;
    `epilogue`: the stage fused into this one's kernel (labkit.gpu.fusion), or None."""
    if old.skipped or old.chunks or old.also_writes or old.reads_ids or not old.dispatches:
        return None
    ctx = RefreshContext(ex, st, kernel, regions, cache, ids, last_only, epilogue, old, arena)
    try:
        out = OPS[st.op].plan(st, ctx)
    except Replan:
        return None
    if len(ctx.dispatches) != len(old.dispatches):
        return None
    return StagePlan(st, out, ctx.dispatches, old.signature)
