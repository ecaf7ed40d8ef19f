"""What one stage's op `plan` sees on the GPU (labkit.ops.base.GpuStage): its input regions, an
output region (the KV cache for a writer), buffers, dispatches of its selected kernel, the matmul,
and the next stage when it fuses into this one. The executor's planner makes one per stage and
collects its dispatches into the stage's plan."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import wgpu

from labkit.gpu.allocator import Allocator
from labkit.gpu.dispatch import Dispatch
from labkit.gpu.fusion import Epilogue
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import Region
from labkit.gpu.texture import FillMemo, Rows, bind_operands
from labkit.model.graph import Stage
from labkit.ops import OPS
from labkit.ops.base import Kernel, PassShape, Policy

if TYPE_CHECKING:
    from labkit.gpu.scratch import ScratchPool
    from labkit.gpu.stage_host import StageHost


@dataclass
class PassScope:
    """What every stage of one pass is planned within: the regions planned so far, the pass's tokens
    and KV cache, and the allocator its GPU objects come from (labkit.gpu.allocator)."""

    regions: dict[str, Region]
    kv: GpuKVCache
    ids: Sequence[int]
    last_only: bool
    objects: Allocator
    scratch: ScratchPool | None = None  # uncaptured stages' regions (labkit.gpu.scratch)
    fused: dict[str, Region] = field(default_factory=dict)  # stages an earlier stage's fused kernel writes
    epilogues: list | None = None  # each stage's fused epilogue, when the pass fuses (labkit.gpu.fusion)
    keys_room: int = 0  # attention maps hold this many keys (a compiled step's: its KV cache's capacity)
    segments: list | None = None  # a batch's sequences (labkit.gpu.batch_plan.Segment); None: one sequence
    parts: dict[str, list[Region]] = field(default_factory=dict)  # a batch's per-sequence outputs, by stage
    fills: FillMemo = field(default_factory=FillMemo)  # the last operand texture filled (labkit.gpu.texture)


class StageContext:
    """What one stage's op `plan` sees (labkit.ops.base.GpuStage); collects its dispatches."""

    def __init__(self, host: StageHost, st: Stage, kernel: Kernel, scope: PassScope, epilogue: Epilogue | None = None):
        self.ex, self.stage, self.kernel, self.scope, self.epilogue = host, st, kernel, scope, epilogue
        self.regions, self.kv, self.ids, self.objects = scope.regions, scope.kv, scope.ids, scope.objects
        self.T, self.n_past = len(scope.ids), scope.kv.n_past
        self.shape = PassShape(self.T, self.n_past)
        scope.fills.stage(st.inputs[0] if st.inputs else None)
        self.dispatches: list[Dispatch] = []
        self.also_writes: dict[str, Region] = {}  # the fused epilogue stage's region
        self.reads_ids = False  # the plan looked at the token ids (token_rows)

    @property
    def last_only(self) -> bool:
        return self.scope.last_only

    def input(self, i: int) -> Region:
        return self.regions[self.stage.inputs[i]]

    def output(self, shape: tuple[int, ...]) -> Region:
        st = self.stage
        if st.kv_write and st.kv_write not in self.kv.types:  # this layer's f32 cache, from position n_past on
            return Region(self.cache(st.kv_write), self.n_past * shape[-1], shape)  # rows of kv_dim
        return self.ex.region(st, shape, self.shape, self.objects, self.scope.scratch, self.scope.keys_room)

    def cache(self, kind: str) -> wgpu.GPUBuffer:
        """This layer's K or V cache: its buffer for the stage that writes it, and for a stage that reads a
        cache of a smaller type, a view its rows are read into first (labkit.ops.kv_cache's load)."""
        buf = (self.kv.k if kind == "k" else self.kv.v)[self.stage.layer]
        t = self.kv.types.get(kind)
        if t is None or self.stage.kv_write == kind:
            return buf
        from labkit.ops import kv_cache

        view = self.kv.views[kind]
        width = self.ex.cfg.cache_dims[kind == "v"]
        kernel = self.ex.kernel_for_op(f"kv_cache_{t}", self.stage.layer)
        values = kv_cache.load_values(t, self.n_past + self.T, width)
        operands = [self.kv.views["none"], buf, view]
        self.dispatches.append(self.ex.dispatch(self.stage, OPS["kv_cache"], kernel, self.shape, operands, values,
                                                kv_cache.LOAD_WORKGROUPS, self.objects))  # fmt: skip
        return view

    def state(self, kind: str) -> wgpu.GPUBuffer:
        """This layer's recurrent state of `kind` ("conv", "scan"), which the stage reads and advances in place."""
        return self.kv.states[(kind, self.stage.layer)]

    def state_region(self, kind: str, size: int) -> Region:
        """This layer's state as a stage's region (a `state` stage: what the pass left in it)."""
        return Region(self.state(kind), 0, (1, size), "state")

    def vector(self, name: str) -> wgpu.GPUBuffer:
        return self.ex.vector(name)

    def experts(self, name: str, rows_per_expert: int) -> Any:
        """A 3-D expert tensor's GGUF bytes in windows of whole experts (labkit.ops.moe_matmul)."""
        return self.ex.expert_weight(name, rows_per_expert)

    def rows(self, buffer: wgpu.GPUBuffer, offset: int, stride: int, width: int, rows: int) -> Rows:
        return Rows(buffer, offset, stride, width, rows)

    def token_rows(self, name: str) -> Region:
        self.reads_ids = True
        return self.ex.token_rows(self.ids, name, self.objects)

    @property
    def loop_turn_cap(self) -> int | None:
        """The device's cap on one invocation's loop turns (llvmpipe's), or None."""
        return self.ex.gpu.loop_turn_cap

    def policy(self, family: str) -> Policy:
        return self.ex.policy(self.stage, family)

    def dispatch(self, operands: list, values: dict, workgroups: int) -> None:
        """One dispatch of the stage's kernel. An operand given as `Rows` is bound as its buffer, or,
        where the kernel declares a texture there, as a texture filled by a dispatch before it."""
        op = OPS[self.stage.op]
        bound, fills = bind_operands(self.objects, self.kernel.source(self.shape), operands, self.stage.name,
                                     self.scope.fills)  # fmt: skip
        self.dispatches += fills
        self.dispatches.append(
            self.ex.dispatch(self.stage, op, self.kernel, self.shape, bound, values, workgroups, self.objects)
        )

    def matmul(self, x: Region, out: Region, rows_T: int, x_skip: int = 0, window_filter=None,
               epilogue: tuple[str, list, dict] | None = None) -> None:  # fmt: skip
        self.dispatches += self.ex.matmul(self, x, out, rows_T, x_skip, window_filter, epilogue)

    def fused_next(self, shape: tuple[int, ...]) -> tuple[Epilogue, Region, Region] | None:
        """The stage after this one when its kernel fuses into this one's (labkit.gpu.fusion): the
        Epilogue, its other input's region, and its own region of `shape` (this stage's), which this
        stage's dispatch writes."""
        ep = self.epilogue
        if ep is None:
            return None
        z = self.ex.region(ep.stage, shape, self.shape, self.objects, self.scope.scratch)
        self.also_writes[ep.stage.name] = z
        return ep, self.regions[ep.other], z

    def head_ids(self, heads: int) -> Region:
        """[T, heads] u32: slot h of every token is h (a per-head matmul run as the experts' matmul)."""
        ids = np.tile(np.arange(heads, dtype=np.uint32), max(self.T, 1))
        return Region(self.objects.data(ids.tobytes(), wgpu.BufferUsage.STORAGE, "head ids"), 0, (self.T, heads))

    def temp(self, shape: tuple[int, ...], what: str) -> Region:
        """A region of this stage's own that is not its output (a matmul's product before its bias)."""
        return Region(self.ex.buffer(math.prod(shape), f"{self.stage.name}.{what}", self.objects), 0, shape)

    def dispatch_op(self, op: str, operands: list, values: dict, workgroups: int) -> None:
        """One dispatch of another op's kernel as selected for this stage's layer (a bias add)."""
        kernel = self.ex.kernel_for_op(op, self.stage.layer)
        self.dispatches.append(
            self.ex.dispatch(self.stage, OPS[op], kernel, self.shape, operands, values, workgroups, self.objects)
        )
