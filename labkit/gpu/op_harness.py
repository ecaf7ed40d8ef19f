"""One stage on the real device, over arrays: how a kernel is checked against its op's reference.

`run_stage` plans one stage with its op's own `plan`, through the same `StageContext` the executor
gives it, on a `CaseHost`: a StageHost (labkit.gpu.stage_host) whose inputs, weights and KV cache
are a case's arrays instead of a GGUF file's tensors and a pass's regions. Buffers, pipelines,
uniforms and matmul windows are built by the code that builds them in a real pass, so a kernel
that passes here runs the same way in a model. Output regions start as NaN: an element the kernel
never writes fails any comparison.

tests/ops/test_ops.py runs every op and variant through it on generated cases, and a user writing a
kernel variant can do the same:

    out = run_stage(StageCase(stage, [x], T=x.shape[0]), my_kernel)
    ref = OPS[stage.op].reference(stage, inputs)  # the float64 side
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit.gpu.device import GpuDevice, get_device
from labkit.gpu.dispatch import encode
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import Region
from labkit.gpu.repack import layout_of, repack_weight, upload_blocks
from labkit.gpu.stage_context import PassScope, StageContext
from labkit.gpu.stage_host import STORAGE, StageHost
from labkit.gpu.weights import GpuWeight, upload_weight
from labkit.model.cache_stages import stored_types
from labkit.model.dequant import dequantize
from labkit.model.graph import Stage
from labkit.model.stage_kinds import BY_KIND
from labkit.model.stage_kinds import layout_of as layout_of_kind
from labkit.ops import OPS
from labkit.ops.base import Kernel, PassShape


@dataclass
class StageCase:
    """One stage's arrays: its inputs (in `stage.inputs` order), T new tokens after `n_past` cached
    ones, weights as GGUF bytes (name -> (raw bytes, ggml type, (rows, cols))), the KV cache
    ("k"/"v" -> [capacity, kv_dim]) and the token ids an embedding reads."""

    stage: Stage
    inputs: list[np.ndarray]
    T: int
    n_past: int = 0
    weights: dict[str, tuple[np.ndarray, int, tuple[int, int]]] = field(default_factory=dict)
    cache: dict[str, np.ndarray] = field(default_factory=dict)
    ids: np.ndarray | None = None
    window_bytes: int | None = None  # smaller weight windows, to cross window edges


class CaseHost(StageHost):
    """A StageHost over one case's arrays."""

    def __init__(self, gpu: GpuDevice, case: Any, policies: dict[str, str] | None = None):
        super().__init__(gpu, dict(policies or {}))
        self.case = case

    def array(self, a: np.ndarray) -> Any:
        """A buffer of float32, or of int32 for integer ids (read as u32 by the kernels)."""
        dtype = np.int32 if np.issubdtype(np.asarray(a).dtype, np.integer) else np.float32
        data = np.ascontiguousarray(a if a.size else np.zeros(1), dtype=dtype).tobytes()
        return self.device.create_buffer_with_data(data=data, usage=STORAGE)

    def dequantized(self, name: str) -> np.ndarray:
        raw, qtype, shape = self.case.weights[name]
        return dequantize(np.asarray(raw), int(qtype), shape)

    def matmul_weight(self, st: Stage, kernel: Kernel) -> GpuWeight:
        raw, qtype, (n_rows, n_cols) = self.case.weights[st.weight]
        if st.weight_rows:
            raw, n_rows = raw[st.weight_rows[0] : st.weight_rows[1]], st.weight_rows[1] - st.weight_rows[0]
        if kernel.repack is not None and layout_of(kernel.repack()).name == "blocks":  # as the weight store does
            layout = layout_of(kernel.repack())
            return upload_blocks(self.gpu, st.weight, np.asarray(raw), int(qtype), n_rows, n_cols, layout,
                                 self.binding_limit, self.case.window_bytes)  # fmt: skip
        w = upload_weight(self.gpu, st.weight, raw, int(qtype), n_rows, n_cols, self.case.window_bytes)
        if kernel.repack is not None:  # the int8 layout, rewritten on the GPU as the weight store does
            w = repack_weight(self.gpu, w, kernel.repack(), self.binding_limit)
        return w

    def vector(self, name: str) -> Any:
        return self.array(self.dequantized(name).ravel())

    def expert_weight(self, name: str, rows_per_expert: int) -> GpuWeight:
        raw, qtype, (n_rows, n_cols) = self.case.weights[name]
        return upload_weight(self.gpu, name, raw, int(qtype), n_rows, n_cols, self.case.window_bytes, rows_per_expert)

    def token_rows(self, ids: Any, name: str, objects: Any = None) -> Region:
        rows = self.dequantized(name)[np.asarray(ids)]
        return Region(self.array(rows), 0, rows.shape)

    def region(self, st: Stage, shape: tuple[int, ...], pass_shape: PassShape, objects: Any = None,
               scratch: Any = None, keys_room: int = 0) -> Region:  # fmt: skip
        layout = layout_of_kind(st.kind) if st.kind in BY_KIND else OPS[st.op].layout
        return Region(self.array(np.full(int(np.prod(shape)), np.nan)), 0, shape, layout)

    def kv_cache(self) -> GpuKVCache:
        """The case's K and V at the stage's layer (a cache of one layer's buffers), and its recurrent
        states ("conv", "scan": what a pass before it left)."""
        layer = self.case.stage.layer or 0
        k, v = (self.case.cache.get(kind) for kind in "kv")
        capacity = max((len(c) for c in (k, v) if c is not None), default=0)
        states = {(kind, layer): self.array(a) for kind, a in self.case.cache.items() if kind not in "kv"}
        st = self.case.stage  # a cache writer of a smaller type: the case's cache is its words (any values)
        types = stored_types([st])
        return GpuKVCache(
            capacity,
            [self.array(k)] * (layer + 1) if k is not None else [],
            [self.array(v)] * (layer + 1) if v is not None else [],
            n_past=self.case.n_past,
            states=states,
            types=types,
        )


def run_stage(case: Any, kernel: Kernel, policies: dict[str, str] | None = None, gpu: GpuDevice | None = None):
    """The GPU output of one stage under `kernel` (and dispatch `policies`, family -> name), read back
    as a float32 array of the shape the op's plan gave it."""
    return run_stage_states(case, kernel, policies, gpu)[0]


def run_stage_states(case: Any, kernel: Kernel, policies: dict[str, str] | None = None,
                     gpu: GpuDevice | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """run_stage's output, and the recurrent states ("conv", "scan") as the stage left them."""
    gpu = gpu or get_device()
    host = CaseHost(gpu, case, policies)
    st = case.stage
    regions = {name: Region(host.array(x), 0, x.shape) for name, x in zip(st.inputs, case.inputs)}
    ids = case.ids if case.ids is not None else range(case.T)
    kv = host.kv_cache()
    ctx = StageContext(host, st, kernel, PassScope(regions, kv, ids, False, gpu.fresh))
    out = OPS[st.op].plan(st, ctx)
    enc = gpu.device.create_command_encoder()
    encode(enc, ctx.dispatches)
    gpu.queue.submit([enc.finish()])
    raw = gpu.queue.read_buffer(out.buffer, 4 * out.offset, 4 * out.size)
    states = {kind: np.frombuffer(gpu.queue.read_buffer(buf), dtype=np.float32) for (kind, _), buf in kv.states.items()}
    return np.frombuffer(raw, dtype=np.int32 if out.layout == "ids" else np.float32).reshape(out.shape), states
