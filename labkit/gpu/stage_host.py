"""What every stage's plan is built on: a device, its limits, compiled kernels and their dispatches.

A `StageContext` (labkit.gpu.stage_context, the one implementation of the GpuStage an op's `plan`
sees) asks its host for regions, buffers, vectors, policies, dispatches and matmuls. Two hosts
exist: the executor, over a GGUF file's weights and a whole pass, and the op harness
(labkit.gpu.op_harness), over one stage's arrays. They share everything here: how a buffer is
made and checked against the device's limits, how a kernel is compiled (its Params checked once),
how its uniform is packed and bound, and how a matmul becomes weight windows x token chunks. A host
says where a matmul's weight comes from (`matmul_weight`), what its vectors and token rows are,
and which variants are selected.
"""

from __future__ import annotations

import math
from typing import Any

import wgpu

from labkit.errors import BufferLimitError
from labkit.gpu.allocator import Allocator
from labkit.gpu.device import GpuDevice
from labkit.gpu.dispatch import Dispatch, grid, new_dispatch
from labkit.gpu.kernel_selection import stage_policy
from labkit.gpu.matmul import prepare_matmul
from labkit.gpu.pass_plan import Region
from labkit.gpu.plan_cache import storage_bytes
from labkit.gpu.quant_table_buffer import tables_bind_group
from labkit.gpu.scratch import ScratchPool
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.weights import GpuWeight
from labkit.model.graph import Stage
from labkit.model.stage_kinds import BY_KIND, layout_of
from labkit.ops import OPS
from labkit.ops.attn_ctx.loop_turns import fused_tier_hint
from labkit.ops.base import Kernel, PassShape, Policy
from labkit.ops.matmul import EPILOGUE_PARAMS
from labkit.ops.registry import adapter_kind, get_kernel, selected

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST

LONG_PROMPT_HINT = (
    ' Capture less: lab.run(prompt, positions="last") computes and reads the logits of the last position only,'
    " and names=[...] / layers=[...] leave other stages out; or run a shorter prompt."
)


class StageHost:
    """A device and its limits, kernels compiled once, and the dispatches stages are planned into."""

    def __init__(self, gpu: GpuDevice, variants: dict[str, str] | None = None):
        self.gpu, self.device = gpu, gpu.device
        self.variants: dict[str, str] = variants if variants is not None else {}
        self.max_binding: int | None = None  # pretend a lower storage-binding limit (tests)
        self.adapter_type: str = gpu.adapter_type  # tests force "DiscreteGPU" to take the real-GPU defaults
        self._checked: set[tuple[str, str]] = set()  # (op, source) whose Params were checked

    # ----- what a host supplies
    def matmul_weight(self, st: Stage, kernel: Kernel) -> GpuWeight:
        """The weight a matmul stage's kernel reads, in that kernel's layout."""
        raise NotImplementedError

    def vector(self, name: str) -> wgpu.GPUBuffer:
        """A 1-D tensor (norm weight, bias) as f32."""
        raise NotImplementedError

    def expert_weight(self, name: str, rows_per_expert: int) -> GpuWeight:
        """A 3-D expert tensor's GGUF bytes, in windows of whole experts."""
        raise NotImplementedError

    def token_rows(self, ids: Any, name: str, objects: Allocator) -> Region:
        """The embedding rows of the pass's tokens, as f32, in a buffer from `objects`."""
        raise NotImplementedError

    @property
    def adapter(self) -> str:
        return adapter_kind(self.adapter_type)

    def policy(self, st: Stage, family: str) -> Policy:
        return stage_policy(st, family, self.variants)

    # ----- buffers and limits
    @property
    def binding_limit(self) -> int:
        """Bytes one storage binding may span: the device's limit, or the lower `max_binding`."""
        limit = self.gpu.max_binding
        return limit if self.max_binding is None else min(limit, int(self.max_binding))

    def buffer(self, n_floats: int, label: str, objects: Allocator) -> wgpu.GPUBuffer:
        """A storage buffer of n floats from `objects` (new, or a plan cache's: labkit.gpu.allocator)."""
        size = storage_bytes(n_floats)
        max_size = int(self.gpu.limits.get("max-buffer-size", size))
        if size > max_size:
            raise BufferLimitError(
                f"{label}: needs a {_mib(size)} buffer, above this device's max-buffer-size of {_mib(max_size)}."
                + LONG_PROMPT_HINT
            )
        return objects.buffer(size, STORAGE, label)

    def check_binding(self, label: str, nbytes: int, shape: PassShape, what: str = "") -> None:
        """BufferLimitError when a kernel would bind `nbytes` whole, above the binding limit."""
        limit = self.binding_limit
        if nbytes <= limit:
            return
        attention_map = label.split(".")[-1] in ("attn_scores", "attn_probs")
        hint = (
            " " + fused_tier_hint(shape.n_past + shape.T, self.gpu.loop_turn_cap) if attention_map else LONG_PROMPT_HINT
        )
        raise BufferLimitError(
            f"{label}: {what or 'its output'} takes {_mib(nbytes)} for {shape.T} tokens"
            f"{f' after {shape.n_past} cached' if shape.n_past else ''}, above this device's "
            f"max-storage-buffer-binding-size of {_mib(limit)}, and its kernel binds it whole.{hint}"
        )

    def region(self, st: Stage, shape: tuple[int, ...], pass_shape: PassShape, objects: Allocator,
               scratch: ScratchPool | None = None, keys_room: int = 0) -> Region:  # fmt: skip
        """A fresh output region, or a scratch one when the pass has a pool and does not keep this
        stage: a matmul's may exceed one binding (bound per token chunk), any other's is checked
        against the binding limit before it is allocated. `keys_room`: an attention map's buffer
        holds that many keys (a compiled decode step's, for its KV cache's capacity), where they
        fit one binding."""
        n = math.prod(shape)
        if not OPS[st.op].chunked_output:
            self.check_binding(st.name, 4 * n, pass_shape, f"its output {list(shape)}")
        layout = layout_of(st.kind) if st.kind in BY_KIND else OPS[st.op].layout  # ids: integers
        if scratch is not None and scratch.wants(st.name):
            return Region(scratch.take(n, st.name), 0, shape, layout)
        room = math.prod(shape[:-1]) * keys_room if layout == "heads" else 0
        size = room if n < room and 4 * room <= self.binding_limit else n
        return Region(self.buffer(size, st.name, objects), 0, shape, layout)

    # ----- dispatches
    def pipeline(self, op_name: str, source: str, label: str):
        """The compiled pipeline of a kernel source, its struct Params checked against the op's once."""
        if (op_name, source) not in self._checked:
            OPS[op_name].params.check(source, label)
            self._checked.add((op_name, source))
        return compile_pipeline(self.gpu, source, label=label)

    def dispatch(self, st: Stage, op, kernel: Kernel, shape: PassShape, buffers, values, workgroups,
                 objects: Allocator) -> Dispatch:  # fmt: skip
        """One dispatch of a kernel: buffers bound whole in order, then its uniform, both from
        `objects`. A buffer above the binding limit is a BufferLimitError naming the stage."""
        limit = self.binding_limit
        for b in buffers:  # outputs were checked in region(); this catches the inputs and the KV cache
            if isinstance(b, wgpu.GPUBuffer) and b.size > limit:
                self.check_binding(st.name, b.size, shape, f"a {kernel.family} operand ({b.label or 'buffer'})")
        source = kernel.source(shape)
        pipe = self.pipeline(op.name, source, f"{kernel.family}/{kernel.name}")
        tables = tables_bind_group(self.gpu, pipe, source)  # a block reader that indexes a grid
        data = op.params.pack(source, values)
        d = new_dispatch(objects, pipe, list(buffers), data, grid(workgroups), st.name, tables)
        d.op = "" if op.name == st.op else op.name
        return d

    def matmul(self, ctx: Any, x: Region, out: Region, rows_T: int, x_skip: int, keep,
               epilogue: tuple[str, list, dict] | None = None) -> list[Dispatch]:  # fmt: skip
        """The one way to build a matmul's dispatches: weight windows x token chunks, with the kernel's
        fused form when `epilogue` = (the next stage's op, its extra bindings, their Params values)
        is given (labkit/ops/matmul decides both that and the bias); its objects from the context's."""
        w = self.matmul_weight(ctx.stage, ctx.kernel)
        K, N = w.n_cols, w.n_rows
        source = ctx.kernel.source(PassShape(rows_T, ctx.shape.n_past))  # the matmul's own token count
        fused = None
        if epilogue is not None:  # (the next stage's op, its extra bindings, its Params values)
            op, buffers, values = epilogue
            few = rows_T > 1 and ctx.kernel.few_epilogue is not None
            source = ctx.kernel.few_epilogue(op, rows_T) if few else ctx.kernel.epilogue(op)
            fused = (buffers, values)
        if ("matmul", source) not in self._checked:  # once per kernel source, off the hot path
            params = OPS["matmul"].params if fused is None else EPILOGUE_PARAMS
            params.check(source, f"{ctx.kernel.family}/{ctx.kernel.name}")
            self._checked.add(("matmul", source))
        return prepare_matmul(
            ctx.objects,
            w,
            x.buffer,
            out.buffer,
            rows_T,
            x_offset=x.offset + x_skip * K,
            x_stride=K,
            y_offset=out.offset,
            y_stride=N,
            source=source,
            max_binding=self.binding_limit,
            window_filter=keep,  # per weight window, whatever the token chunks
            epilogue=fused,
            memo=ctx.scope.fills,  # q, k and v fill one X texture between them
        )

    def kernel_for_op(self, op: str, layer: int | None) -> Kernel:
        return get_kernel(op, selected(self.variants, op, layer), self.adapter)

    def default_dispatch(self, op: str, buffers: list, values: dict, workgroups: int, label: str,
                         objects: Allocator) -> Dispatch:  # fmt: skip
        """A dispatch of an op's correct kernel, whatever is selected (the GPU sampler's softmax)."""
        kernel = get_kernel(op, "default", self.adapter)
        source = kernel.source()
        pipe = self.pipeline(op, source, f"{op}/default")
        return new_dispatch(objects, pipe, list(buffers), OPS[op].params.pack(source, values), grid(workgroups), label)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
