"""Dispatches: a pipeline, its bind group and a workgroup count, recorded in one pass.

Conventions every kernel follows:
- a 1-D count of n workgroups is launched as `grid(n)`; when n is above the per-dimension
  limit (65 535) it becomes 2-D, and kernels compute the linear id as
  `wid.x + wid.y * nwg.x` and return early when it is >= n;
- every dispatch owns its uniform buffer (`uniform`): rewriting one uniform buffer between
  dispatches of one encoder makes all of them see the last value (measured on lavapipe).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import wgpu

from labkit.errors import GpuLimitError
from labkit.gpu.allocator import Allocator


@dataclass
class Dispatch:
    pipeline: Any
    bind_group: Any
    workgroups: tuple[int, int, int]
    label: str = ""
    tables: Any = None  # bind group 1, QUANT_TABLES, for a block reader that indexes a grid
    resources: tuple = ()  # what bind_group binds, its uniform last (labkit.gpu.compiled_step reads them)
    filled: tuple = ()  # a texture fill's (Rows, view): the rows it copies and the texture it fills
    op: str = ""  # the op whose kernel it runs, where not its stage's (a cache load in an attention stage)
    n_past: int | None = None  # a batch's per-sequence dispatch: its sequence's position (labkit.gpu.batch_plan)


def grid(n: int, max_dim: int = 65535) -> tuple[int, int, int]:
    """Workgroup counts for n workgroups: (n, 1, 1), or 2-D (x, y, 1) with x*y >= n."""
    if n < 0:
        raise GpuLimitError(f"negative workgroup count {n}")
    if n <= max_dim:
        return (n, 1, 1)
    y = math.ceil(n / max_dim)
    if y > max_dim:
        raise GpuLimitError(f"{n} workgroups do not fit a {max_dim} x {max_dim} grid")
    x = math.ceil(n / y)
    return (x, y, 1)


def uniform(objects: Allocator, fmt: str, *values: Any) -> Any:
    """A uniform holding struct.pack(fmt, *values), zero-padded to 16 bytes."""
    data = struct.pack(fmt, *values)
    return objects.uniform((data + b"\0" * (-len(data) % 16)) or b"\0" * 16)


def new_dispatch(objects: Allocator, pipeline: Any, buffers: list, data: bytes, workgroups: tuple, label: str = "",
                 tables: Any = None, after: tuple = ()) -> Dispatch:  # fmt: skip
    """A dispatch binding `buffers` in order, a uniform holding `data` (an op's packed Params, a
    multiple of 16 bytes), then `after` (a fused matmul's extra operands), all from `objects`. Its
    resources are kept when the uniform is a slot of an arena: a compiled step
    (labkit.gpu.compiled_step) finds its uniform's words there; a fresh pass's uniforms go with its
    bind groups."""
    u = objects.uniform(data)
    resources = (*buffers, *after, u) if isinstance(u, tuple) else ()
    return Dispatch(pipeline, objects.bind(pipeline, [*buffers, u, *after]), workgroups, label, tables, resources)


def _native_pass_calls() -> tuple | None:
    """wgpu-native's own set-pipeline, set-bind-group and dispatch functions, called without wgpu-py's
    per-call error capture (a Python frame, a thread-local stack and an ErrorSlot per call: 5.3 of a
    SmolLM2 decode step's 96 ms went to recording its ~640 dispatches). Nothing is lost: wgpu
    validates a pass's commands when its encoder finishes, and `finish()` still raises them as
    GPUValidationError. None when this wgpu-py has no such module (then its methods are used)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib
    except ImportError:
        return None
    return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
            lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)  # fmt: skip


_NATIVE_PASS_CALLS = _native_pass_calls()


def native_recording() -> bool:
    """Whether encode records through wgpu-native's own functions (`native_commands` then apply)."""
    return _NATIVE_PASS_CALLS is not None


def encode(encoder: Any, dispatches: list[Dispatch], label: str = "", timestamp_writes: dict | None = None,
           commands: list[list] | None = None) -> None:  # fmt: skip
    """Record the dispatches, in order, in one compute pass of `encoder`: the one compute-pass
    recorder. WebGPU makes each dispatch its own usage scope, so a dispatch sees everything the ones
    before it wrote; one pass instead of one per stage saves lavapipe's per-pass cost (0.3 ms).
    `commands`: the same dispatches as `native_commands` gave them (a compiled step's, kept)."""
    kw = {"timestamp_writes": timestamp_writes} if timestamp_writes else {}
    cpass = encoder.begin_compute_pass(label=label, **kw)
    if _NATIVE_PASS_CALLS is None:
        for d in dispatches:
            cpass.set_pipeline(d.pipeline)
            cpass.set_bind_group(0, d.bind_group)
            if d.tables is not None:
                cpass.set_bind_group(1, d.tables)
            cpass.dispatch_workgroups(*d.workgroups)
    else:
        _record_native(cpass._internal, commands if commands is not None else native_commands(dispatches))
    cpass.end()


def native_commands(dispatches: list[Dispatch]) -> list[list]:
    """Each dispatch as [pipeline, bind group, tables or None, x, y, z] of wgpu-native handles: what
    `_record_native` passes on. A compiled step keeps its list and rewrites only the counts that move."""
    return [
        [d.pipeline._internal, d.bind_group._internal, None if d.tables is None else d.tables._internal, *d.workgroups]
        for d in dispatches
    ]


def _record_native(handle: Any, commands: list[list]) -> None:
    """encode's loop through wgpu-native's functions (_native_pass_calls); a pipeline set once for
    a run of dispatches of it."""
    set_pipeline, set_bind_group, dispatch, null = _NATIVE_PASS_CALLS
    last = None
    for pipeline, group, tables, x, y, z in commands:
        if pipeline is not last:
            set_pipeline(handle, pipeline)
            last = pipeline
        set_bind_group(handle, 0, group, 0, null)
        if tables is not None:
            set_bind_group(handle, 1, tables, 0, null)
        dispatch(handle, x, y, z)


def pass_timestamps(query_set: Any, index: int) -> dict | None:
    """`timestamp_writes` for compute pass `index` of a query set (2 timestamps a pass); None untimed."""
    if query_set is None:
        return None
    return {
        "query_set": query_set,
        "beginning_of_pass_write_index": 2 * index,
        "end_of_pass_write_index": 2 * index + 1,
    }


def resolve_timestamps(device: Any, enc: Any, query_set: Any, n_passes: int) -> Any:
    """A buffer the 2 timestamps of each of `n_passes` passes are resolved into, at the end of `enc`."""
    buf = device.create_buffer(size=16 * n_passes, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    enc.resolve_query_set(query_set, 0, 2 * n_passes, buf, 0)
    return buf


def run(gpu: Any, dispatches: list[Dispatch], label: str = "") -> None:
    """Encode the dispatches in one pass and submit them (no wait)."""
    enc = gpu.device.create_command_encoder(label=label)
    encode(enc, dispatches, label)
    gpu.queue.submit([enc.finish()])


def wait_idle(gpu: Any) -> None:
    """Block until the queue has run everything submitted (a 4-byte readback: wgpu-py 0.32's
    on_submitted_work_done_sync fails), which also lets wgpu free the buffers dropped meanwhile."""
    if getattr(gpu, "_idle_probe", None) is None:
        gpu._idle_probe = gpu.device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
    gpu.queue.read_buffer(gpu._idle_probe, 0, 4)
