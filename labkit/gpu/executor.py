"""The GPU executor: runs a model's stage graph on WebGPU, batched or one stage at a time.

Every stage writes its own output buffer (k_rope and v write straight into the
KV cache), so nothing is overwritten within a pass: captures are plain copies
recorded at the end of the same command encoder, and a batched run reads back
exactly what a stepped run reads. In debug mode every output region is filled
with a poison bit pattern before the pass; poison left afterwards is "unwritten".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import wgpu

from labkit.errors import UnknownStageError
from labkit.gpu.device import GpuDevice, get_device
from labkit.gpu.dispatch import Dispatch, bind, grid, uniform
from labkit.gpu.matmul import prepare_matmul
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.variants import get_variant, matmul_family
from labkit.gpu.weights import GpuWeight, upload_weight
from labkit.model.config import ModelConfig
from labkit.model.dequant import dequantize, dequantize_rows
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage

POISON_BITS = 0x7FBADBAD  # a quiet-less NaN payload no kernel produces by arithmetic
POISON = np.array([POISON_BITS], dtype=np.uint32).view(np.float32)[0]
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
ACT_CODES = {"gelu_tanh": 0, "silu": 1}


@dataclass
class Region:
    """Where a stage's output lives: a buffer, a float offset, and the capture shape."""

    buffer: wgpu.GPUBuffer
    offset: int  # in floats
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class StagePlan:
    stage: Stage
    out: Region
    dispatches: list[Dispatch]


@dataclass
class GpuKVCache:
    """Per-layer K (roped) and V buffers of `capacity` positions on the GPU."""

    capacity: int
    k: list[wgpu.GPUBuffer]
    v: list[wgpu.GPUBuffer]
    n_past: int = 0


@dataclass
class PassResult:
    captures: dict[str, np.ndarray]
    unwritten: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stage_ms: dict[str, float] = field(default_factory=dict)


class GpuExecutor:
    """Owns the weights on the GPU and turns (ids, cache) into recorded dispatches."""

    def __init__(
        self,
        gguf: GgufFile,
        cfg: ModelConfig,
        graph: list[Stage],
        variants: dict[str, str] | None = None,
        gpu: GpuDevice | None = None,
    ):
        self.gguf, self.cfg, self.graph = gguf, cfg, graph
        self.gpu = gpu or get_device()
        self.device = self.gpu.device
        self.variants: dict[str, str] = dict(variants or {})
        self._weights: dict[str, GpuWeight] = {}
        self._vectors: dict[str, wgpu.GPUBuffer] = {}
        self.upload_seconds = 0.0

    # ----- weights
    def weight(self, name: str) -> GpuWeight:
        """A matmul weight: GGUF bytes uploaded unchanged (row windows above the binding limit)."""
        if name not in self._weights:
            t0 = time.perf_counter()
            t = self.gguf.tensors[name]
            self._weights[name] = upload_weight(self.gpu, name, self.gguf.raw(name), t.ggml_type, t.n_rows, t.n_cols)
            # write_buffer stages a host copy until the queue flushes: flush now, so staging for
            # the whole model never piles up; then drop the mapped pages (lavapipe keeps the
            # buffer itself in host memory already).
            self.device.queue.submit([])
            self.gguf.release(name)
            self.upload_seconds += time.perf_counter() - t0
        return self._weights[name]

    def vector(self, name: str) -> wgpu.GPUBuffer:
        """A 1-D tensor (norm weight, bias) as f32: tiny, so decoded on the host."""
        if name not in self._vectors:
            t = self.gguf.tensors[name]
            data = dequantize(self.gguf.raw(name), t.ggml_type, t.shape).astype(np.float32).ravel()
            self._vectors[name] = self.device.create_buffer_with_data(data=data.tobytes(), usage=STORAGE)
        return self._vectors[name]

    def upload_all(self) -> None:
        """Put every weight on the GPU now (otherwise it happens on first use)."""
        for st in self.graph:
            if st.op == "matmul":
                self.weight(st.weight)
            elif st.weight and st.op != "embed":
                self.vector(st.weight)
            if st.bias:
                self.vector(st.bias)

    def gpu_bytes(self) -> int:
        """Bytes of weight buffers on the device (host memory on lavapipe)."""
        windows = sum(win.buffer.size for w in self._weights.values() for win in w.windows)
        return windows + sum(b.size for b in self._vectors.values())

    # ----- kernels
    def pipeline(self, family: str):
        v = get_variant(family, self.variants.get(family, "default"))
        return compile_pipeline(self.gpu, v.source(), label=f"{family}/{v.name}")

    def source(self, family: str) -> str:
        return get_variant(family, self.variants.get(family, "default")).source()

    def buffer(self, n_floats: int, label: str = "") -> wgpu.GPUBuffer:
        return self.device.create_buffer(size=max(16, 4 * n_floats + 15 & ~15), usage=STORAGE, label=label)

    def new_cache(self, capacity: int) -> GpuKVCache:
        kv = self.cfg.kv_dim
        mk = lambda L, s: self.buffer(capacity * kv, f"cache.{s}.{L}")  # noqa: E731
        return GpuKVCache(
            capacity,
            [mk(L, "k") for L in range(self.cfg.n_layers)],
            [mk(L, "v") for L in range(self.cfg.n_layers)],
        )

    # ----- planning one pass
    def plan(
        self, T: int, cache: GpuKVCache, embed_in: wgpu.GPUBuffer, last_logits_only: bool = False
    ) -> list[StagePlan]:
        """Buffers and dispatches for T new tokens after cache.n_past cached ones."""
        cfg, n_past = self.cfg, cache.n_past
        n_keys = n_past + T
        regions: dict[str, Region] = {}
        plans: list[StagePlan] = []
        for st in self.graph:
            P = st.params
            if st.op == "embed":
                out = Region(self.buffer(T * cfg.d_model, st.name), 0, (T, cfg.d_model))
                pipe = self.pipeline("embed")
                u = uniform(self.gpu, "<IfII", out.size, P["scale"], 0, 0)
                bg = bind(self.gpu, pipe, [embed_in, out.buffer, u])
                dsp = [Dispatch(pipe, bg, grid(-(-out.size // 64)), st.name)]
            elif st.op == "rmsnorm":
                x = regions[st.inputs[0]]
                out = Region(self.buffer(x.size, st.name), 0, x.shape)
                n_groups = x.size // P["group"]
                pipe = self.pipeline("rmsnorm")
                u = uniform(self.gpu, "<IIfI", n_groups, P["group"], P["eps"], 0)
                bg = bind(self.gpu, pipe, [_view(x), self.vector(st.weight), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(n_groups), st.name)]
            elif st.op == "matmul":
                out, dsp = self._plan_matmul(st, regions, cache, T, last_logits_only)
            elif st.op == "rope":
                x = regions[st.inputs[0]]
                if st.kind == "k_rope":  # roped keys go straight into the cache
                    out = Region(cache.k[st.layer], n_past * cfg.kv_dim, x.shape)
                else:
                    out = Region(self.buffer(x.size, st.name), 0, x.shape)
                pipe = self.pipeline("rope")
                u = uniform(
                    self.gpu,
                    "<IIIIIIfI",
                    T,
                    P["n_heads"],
                    P["head_dim"],
                    P["rope_dim"],
                    n_past,
                    1 if P["style"] == "neox" else 0,
                    P["base"],
                    out.offset,
                )
                bg = bind(self.gpu, pipe, [_view(x), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(-(-x.size // 64)), st.name)]
            elif st.op == "attn_scores":
                q = regions[st.inputs[0]]
                out = Region(self.buffer(P["n_heads"] * T * n_keys, st.name), 0, (P["n_heads"], T, n_keys))
                pipe = self.pipeline("attn_scores")
                u = uniform(
                    self.gpu,
                    "<IIIIIIIf",
                    T,
                    n_keys,
                    n_past,
                    P["n_heads"],
                    P["n_kv_heads"],
                    P["head_dim"],
                    P["window"] or 0,
                    P["scale"],
                )
                k_all = Region(cache.k[st.layer], 0, (n_keys, cfg.kv_dim))
                bg = bind(self.gpu, pipe, [_view(q), _view(k_all), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(-(-out.size // 64)), st.name)]
            elif st.op == "softmax":
                x = regions[st.inputs[0]]
                out = Region(self.buffer(x.size, st.name), 0, x.shape)
                n = x.shape[-1]
                pipe = self.pipeline("softmax")
                u = uniform(self.gpu, "<IIII", x.size // n, n, 0, 0)
                bg = bind(self.gpu, pipe, [_view(x), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(x.size // n), st.name)]
            elif st.op == "attn_ctx":
                a = regions[st.inputs[0]]
                out = Region(self.buffer(T * cfg.q_dim, st.name), 0, (T, P["n_heads"] * P["head_dim"]))
                pipe = self.pipeline("attn_ctx")
                u = uniform(
                    self.gpu,
                    "<IIIIIIII",
                    T,
                    n_keys,
                    P["n_heads"],
                    P["n_kv_heads"],
                    P["head_dim"],
                    0,
                    0,
                    0,
                )
                v_all = Region(cache.v[st.layer], 0, (n_keys, cfg.kv_dim))
                bg = bind(self.gpu, pipe, [_view(a), _view(v_all), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(-(-out.size // 64)), st.name)]
            elif st.op == "add":
                a, b = regions[st.inputs[0]], regions[st.inputs[1]]
                out = Region(self.buffer(a.size, st.name), 0, a.shape)
                dsp = [self._add(_view(a), _view(b), _view(out), a.size, b.size, st.name)]
            elif st.op == "glu":
                g, up = regions[st.inputs[0]], regions[st.inputs[1]]
                out = Region(self.buffer(g.size, st.name), 0, g.shape)
                pipe = self.pipeline("glu")
                u = uniform(self.gpu, "<IIII", g.size, ACT_CODES[P["act"]], 0, 0)
                bg = bind(self.gpu, pipe, [_view(g), _view(up), _view(out), u])
                dsp = [Dispatch(pipe, bg, grid(-(-g.size // 64)), st.name)]
            else:
                raise UnknownStageError(f"GPU executor has no op {st.op!r}")
            regions[st.name] = out
            plans.append(StagePlan(st, out, dsp))
        return plans

    def _add(self, a, b, out, n: int, period: int, label: str) -> Dispatch:
        pipe = self.pipeline("add")
        u = uniform(self.gpu, "<IIII", n, period, 0, 0)
        return Dispatch(pipe, bind(self.gpu, pipe, [a, b, out, u]), grid(-(-n // 64)), label)

    def _plan_matmul(
        self, st: Stage, regions: dict[str, Region], cache: GpuKVCache, T: int, last_only: bool
    ) -> tuple[Region, list[Dispatch]]:
        x = regions[st.inputs[0]]
        w = self.weight(st.weight)
        K, N = w.n_cols, w.n_rows
        rows_T, x_off = T, 0
        if st.name == "logits" and last_only:
            rows_T, x_off = 1, (T - 1) * K
        if st.kind == "v" and st.layer is not None:  # values go straight into the cache
            out = Region(cache.v[st.layer], cache.n_past * N, (T, N))
        else:
            out = Region(self.buffer(rows_T * N, st.name), 0, (rows_T, N))
        target = out if not st.bias else Region(self.buffer(rows_T * N, st.name + ".nobias"), 0, out.shape)
        src = self.source(matmul_family(w.ggml_type))
        dsp = prepare_matmul(
            self.gpu,
            w,
            x.buffer,
            target.buffer,
            rows_T,
            x_offset=x.offset + x_off,
            x_stride=K,
            y_offset=target.offset,
            y_stride=N,
            source=src,
        )
        if st.bias:
            dsp.append(self._add(_view(target), self.vector(st.bias), _view(out), rows_T * N, N, st.name))
        return out, dsp

    # ----- running
    def embed_input(self, ids: list[int]) -> wgpu.GPUBuffer:
        """Embedding rows of the new tokens, read from the mapped file (only those rows)."""
        t = self.gguf.tensors["token_embd.weight"]
        rows = dequantize_rows(
            self.gguf.raw("token_embd.weight"),
            t.ggml_type,
            t.n_cols,
            np.asarray(ids, dtype=np.int64),
        ).astype(np.float32)
        return self.device.create_buffer_with_data(data=rows.tobytes(), usage=STORAGE)

    def run_pass(
        self,
        ids: list[int],
        cache: GpuKVCache,
        names: Iterable[str] | None = None,
        debug: bool = False,
        last_logits_only: bool = False,
        timestamps: bool = False,
        stepped: bool = False,
    ) -> PassResult:
        """One forward pass of `ids` (batched: one encoder; stepped: one submit per stage)."""
        t0 = time.perf_counter()
        T = len(ids)
        plans = self.plan(T, cache, self.embed_input(ids), last_logits_only)
        want = set(p.stage.name for p in plans) if names is None else set(names)
        captured = [p for p in plans if p.stage.name in want or debug]
        if debug:
            for p in plans:
                poison_region(self.device, p.out)
        t1 = time.perf_counter()
        stage_ms: dict[str, float] = {}
        if stepped:
            for p in plans:
                enc = self.device.create_command_encoder()
                record_stage(enc, p)
                self.device.queue.submit([enc.finish()])
            staging, offsets = None, None
            enc = self.device.create_command_encoder()
            staging, offsets = record_captures(self.device, enc, captured)
            self.device.queue.submit([enc.finish()])
        else:
            enc = self.device.create_command_encoder()
            qs = None
            if timestamps and self.gpu.has_timestamps:
                qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * len(plans))
            for i, p in enumerate(plans):
                record_stage(enc, p, qs, i)
            staging, offsets = record_captures(self.device, enc, captured)
            if qs is not None:
                ts_buf = self.device.create_buffer(
                    size=16 * len(plans),
                    usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC,
                )
                enc.resolve_query_set(qs, 0, 2 * len(plans), ts_buf, 0)
            self.device.queue.submit([enc.finish()])
            if qs is not None:
                ticks = np.frombuffer(self.device.queue.read_buffer(ts_buf), dtype=np.uint64).reshape(-1, 2)
                stage_ms = {p.stage.name: float(e - s) / 1e6 for p, (s, e) in zip(plans, ticks)}
        caps = read_captures(staging, offsets, captured)
        t2 = time.perf_counter()
        cache.n_past += T
        unwritten = {}
        if debug:
            unwritten = {n: int(np.sum(a.view(np.uint32) == POISON_BITS)) for n, a in caps.items()}
            caps = {n: a for n, a in caps.items() if n in want}
        timings = {"plan_s": t1 - t0, "gpu_s": t2 - t1, "total_s": t2 - t0}
        return PassResult(caps, unwritten, timings, stage_ms)


def _view(r: Region) -> wgpu.GPUBuffer:
    """Regions are bound whole; a kernel that writes at an offset takes it in its Params."""
    return r.buffer


def record_stage(enc, plan: StagePlan, query_set=None, index: int = 0) -> None:
    kw = {}
    if query_set is not None:
        kw["timestamp_writes"] = {
            "query_set": query_set,
            "beginning_of_pass_write_index": 2 * index,
            "end_of_pass_write_index": 2 * index + 1,
        }
    cp = enc.begin_compute_pass(**kw)
    for d in plan.dispatches:
        cp.set_pipeline(d.pipeline)
        cp.set_bind_group(0, d.bind_group)
        cp.dispatch_workgroups(*d.workgroups)
    cp.end()


def poison_region(device, r: Region) -> None:
    device.queue.write_buffer(r.buffer, 4 * r.offset, np.full(r.size, POISON_BITS, dtype=np.uint32).tobytes())


def record_captures(device, enc, plans: list[StagePlan]):
    """Copy every captured region into one mappable staging buffer, in the same encoder."""
    offsets, total = [], 0
    for p in plans:
        offsets.append(total)
        total += (4 * p.out.size + 255) & ~255
    if total == 0:
        return None, []
    staging = device.create_buffer(size=total, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    for p, off in zip(plans, offsets):
        enc.copy_buffer_to_buffer(p.out.buffer, 4 * p.out.offset, staging, off, 4 * p.out.size)
    return staging, offsets


def read_captures(staging, offsets, plans: list[StagePlan]) -> dict[str, np.ndarray]:
    if staging is None:
        return {}
    staging.map_sync(wgpu.MapMode.READ)
    data = staging.read_mapped(copy=True)
    staging.unmap()
    staging.destroy()
    raw = np.frombuffer(data, dtype=np.uint8)
    out = {}
    for p, off in zip(plans, offsets):
        out[p.stage.name] = raw[off : off + 4 * p.out.size].view(np.float32).reshape(p.out.shape).copy()
    return out


Patch = Callable[[np.ndarray, str], np.ndarray]
