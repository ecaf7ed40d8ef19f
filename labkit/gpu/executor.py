"""The GPU executor: runs a model's stage graph on WebGPU, batched or one stage at a time.

Every stage writes its own output region (k_rope and v write straight into the KV
cache), so nothing is overwritten within a pass: captures are plain copies
recorded at the end of the same command encoder, and a batched run reads back
exactly what a stepped run reads. In debug mode every output region is filled
with a poison bit pattern before the pass; poison left afterwards is "unwritten".
Stages a fused attention variant does without (scores, probs) are `skipped`: they get
a placeholder buffer, no dispatch, and are never captured.

Matmuls bind X and Y per chunk of tokens when a buffer is bigger than one storage
binding (Gemma's [T, 262144] logits); every other kernel binds its buffers whole, so a
region above the limit (attn_scores [H, T, T] at thousands of tokens) is a
PromptTooLongError at plan time, not a GPU validation error.

Because regions outlive the pass, a re-run of the same tokens after a variant
switch re-records only the stages from the first one the switch affects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import wgpu

from labkit.captures import POISON_BITS, poison_count  # defined with the captures that report it; re-exported here
from labkit.errors import PromptTooLongError, UnknownStageError
from labkit.gpu.device import GpuDevice, get_device
from labkit.gpu.dispatch import Dispatch, bind, grid, uniform
from labkit.gpu.matmul import prepare_matmul
from labkit.gpu.shader import compile_pipeline
from labkit.gpu.variants import PassShape, Variant, check_selection, get_variant, matmul_family
from labkit.gpu.weights import GpuWeight, upload_weight
from labkit.model.config import ModelConfig
from labkit.model.dequant import dequantize, dequantize_rows
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
ACT_CODES = {"gelu_tanh": 0, "silu": 1}
Patch = Callable[[np.ndarray, str], np.ndarray]


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
    signature: tuple = ()  # the variants that produced it; a re-run starts where this changes
    skipped: bool = False  # not computed in this pass (scores/probs under fused attention)


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
    plans: list[StagePlan] = field(default_factory=list, repr=False)
    recomputed_from: str | None = None


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
        self.variants: dict[str, str] = variants if variants is not None else {}  # shared with the Lab
        check_selection(self.variants)
        self._weights: dict[str, GpuWeight] = {}
        self._vectors: dict[str, wgpu.GPUBuffer] = {}
        self.upload_seconds = 0.0
        self.window_bytes: int | None = None  # force smaller weight windows (teaching, tests)
        self.max_binding: int | None = None  # pretend a lower storage-binding limit (tests)

    # ----- weights
    def weight(self, name: str) -> GpuWeight:
        """A matmul weight: GGUF bytes uploaded unchanged (row windows above the binding limit)."""
        if name not in self._weights:
            t0 = time.perf_counter()
            t = self.gguf.tensors[name]
            self._weights[name] = upload_weight(
                self.gpu, name, self.gguf.raw(name), t.ggml_type, t.n_rows, t.n_cols, max_window_bytes=self.window_bytes
            )
            # write_buffer stages a host copy until the queue flushes: flush per tensor so staging
            # never piles up, then drop the mapped pages (lavapipe keeps the buffer in host memory).
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

    # ----- variants and kernels
    def family(self, st: Stage) -> str:
        """The op family whose variant runs this stage."""
        if st.op == "matmul":
            return matmul_family(self.gguf.tensors[st.weight].ggml_type)
        return st.op

    def variant(self, family: str) -> Variant:
        return get_variant(family, self.variants.get(family, "default"))

    def pipeline(self, family: str, shape: PassShape):
        v = self.variant(family)
        return compile_pipeline(self.gpu, v.source(shape), label=f"{family}/{v.name}")

    def signature(self, st: Stage) -> tuple:
        """The variant choices a stage's output depends on directly."""
        fams = [self.family(st)]
        if st.op in ("attn_scores", "softmax", "attn_ctx"):
            fams += ["attn_ctx"]
        if st.name == "logits":
            fams += ["lm_head"]
        return tuple((f, self.variants.get(f, "default")) for f in fams)

    @property
    def binding_limit(self) -> int:
        """Bytes one storage binding may span: the device's limit, or the lower `max_binding`."""
        limit = self.gpu.max_binding
        return limit if self.max_binding is None else min(limit, int(self.max_binding))

    def buffer(self, n_floats: int, label: str = "") -> wgpu.GPUBuffer:
        size = max(16, (4 * n_floats + 15) & ~15)
        max_size = int(self.gpu.limits.get("max-buffer-size", size))
        if size > max_size:
            raise PromptTooLongError(
                f"{label}: needs a {_mib(size)} buffer, above this device's max-buffer-size of {_mib(max_size)}; "
                "run a shorter prompt"
            )
        return self.device.create_buffer(size=size, usage=STORAGE, label=label)

    def _check_binding(self, label: str, nbytes: int, shape: PassShape, what: str = "") -> None:
        """PromptTooLongError when a kernel would bind `nbytes` whole, above the binding limit."""
        limit = self.binding_limit
        if nbytes <= limit:
            return
        stage = label.split(".", 2)[-1] if label.startswith("blk.") else label
        hint = (
            ' Use variants={"attn_ctx": "streaming"} (or lab.use("attn_ctx", "streaming")): fused attention'
            " does not materialize the scores and probabilities."
            if stage in ("attn_scores", "attn_probs")
            else " Run a shorter prompt."
        )
        raise PromptTooLongError(
            f"{label}: {what or 'its output'} takes {_mib(nbytes)} for {shape.T} tokens"
            f"{f' after {shape.n_past} cached' if shape.n_past else ''}, above this device's "
            f"max-storage-buffer-binding-size of {_mib(limit)}, and its kernel binds it whole.{hint}"
        )

    def _region(self, st: Stage, shape_: tuple[int, ...], pass_shape: PassShape) -> Region:
        """A fresh output region for a non-matmul stage: checked against the binding limit before it
        is allocated."""
        n = int(np.prod(shape_))
        self._check_binding(st.name, 4 * n, pass_shape, f"its output {list(shape_)}")
        return Region(self.buffer(n, st.name), 0, shape_)

    def new_cache(self, capacity: int) -> GpuKVCache:
        kv = self.cfg.kv_dim
        return GpuKVCache(
            capacity,
            [self.buffer(capacity * kv, f"cache.k.{L}") for L in range(self.cfg.n_layers)],
            [self.buffer(capacity * kv, f"cache.v.{L}") for L in range(self.cfg.n_layers)],
        )

    # ----- planning one pass
    def plan(
        self,
        T: int,
        cache: GpuKVCache,
        embed_in: wgpu.GPUBuffer,
        last_logits_only: bool = False,
        reuse: list[StagePlan] | None = None,
        start: int = 0,
    ) -> list[StagePlan]:
        """Regions and dispatches for T new tokens after cache.n_past cached ones.

        With `reuse`, stages before `start` keep their regions (and data) and get no dispatches."""
        cfg, n_past = self.cfg, cache.n_past
        n_keys = n_past + T
        shape = PassShape(T, n_past)
        fused = self.variant("attn_ctx").fused
        regions: dict[str, Region] = {}
        plans: list[StagePlan] = []
        for i, st in enumerate(self.graph):
            if reuse is not None and i < start:
                old = reuse[i]
                regions[st.name] = old.out
                plans.append(StagePlan(st, old.out, [], old.signature, old.skipped))
                continue
            P = st.params
            if fused and st.op in ("attn_scores", "softmax"):  # the fused kernel does without them
                shape_ = (P["n_heads"], T, n_keys) if st.op == "attn_scores" else regions[st.inputs[0]].shape
                regions[st.name] = Region(self.buffer(4, st.name + ".skipped"), 0, shape_)  # a placeholder
                plans.append(StagePlan(st, regions[st.name], [], self.signature(st), skipped=True))
                continue
            if st.op == "embed":
                out = self._region(st, (T, cfg.d_model), shape)
                dsp = [
                    self._simple(
                        "embed",
                        shape,
                        [embed_in, out.buffer],
                        "<IfII",
                        (out.size, P["scale"], 0, 0),
                        grid(-(-out.size // 64)),
                        st.name,
                    )
                ]
            elif st.op == "rmsnorm":
                x = regions[st.inputs[0]]
                out = self._region(st, x.shape, shape)
                n_groups = x.size // P["group"]
                dsp = [
                    self._simple(
                        "rmsnorm",
                        shape,
                        [x.buffer, self.vector(st.weight), out.buffer],
                        "<IIfI",
                        (n_groups, P["group"], P["eps"], 0),
                        grid(n_groups),
                        st.name,
                    )
                ]
            elif st.op == "matmul":
                out, dsp = self._plan_matmul(st, regions, cache, T, last_logits_only)
            elif st.op == "rope":
                x = regions[st.inputs[0]]
                if st.kind == "k_rope":  # roped keys go straight into the cache
                    out = Region(cache.k[st.layer], n_past * cfg.kv_dim, x.shape)
                else:
                    out = self._region(st, x.shape, shape)
                vals = (
                    T,
                    P["n_heads"],
                    P["head_dim"],
                    P["rope_dim"],
                    n_past,
                    int(P["style"] == "neox"),
                    P["base"],
                    out.offset,
                )
                dsp = [
                    self._simple(
                        "rope", shape, [x.buffer, out.buffer], "<IIIIIIfI", vals, grid(-(-x.size // 64)), st.name
                    )
                ]
            elif st.op == "attn_scores":
                q = regions[st.inputs[0]]
                out = self._region(st, (P["n_heads"], T, n_keys), shape)
                vals = (T, n_keys, n_past, P["n_heads"], P["n_kv_heads"], P["head_dim"], P["window"] or 0, P["scale"])
                dsp = [
                    self._simple(
                        "attn_scores",
                        shape,
                        [q.buffer, cache.k[st.layer], out.buffer],
                        "<IIIIIIIf",
                        vals,
                        grid(-(-out.size // 64)),
                        st.name,
                    )
                ]
            elif st.op == "softmax":
                x = regions[st.inputs[0]]
                out = self._region(st, x.shape, shape)
                n = x.shape[-1]
                dsp = [
                    self._simple(
                        "softmax",
                        shape,
                        [x.buffer, out.buffer],
                        "<IIII",
                        (x.size // n, n, 0, 0),
                        grid(x.size // n),
                        st.name,
                    )
                ]
            elif st.op == "attn_ctx":
                out = self._region(st, (T, P["n_heads"] * P["head_dim"]), shape)
                dsp = [self._plan_attn_ctx(st, regions, cache, out, shape, fused)]
            elif st.op == "add":
                a, b = regions[st.inputs[0]], regions[st.inputs[1]]
                out = self._region(st, a.shape, shape)
                dsp = [self._add(a.buffer, b.buffer, out.buffer, a.size, b.size, st.name, shape)]
            elif st.op == "glu":
                g, up = regions[st.inputs[0]], regions[st.inputs[1]]
                out = self._region(st, g.shape, shape)
                dsp = [
                    self._simple(
                        "glu",
                        shape,
                        [g.buffer, up.buffer, out.buffer],
                        "<IIII",
                        (g.size, ACT_CODES[P["act"]], 0, 0),
                        grid(-(-g.size // 64)),
                        st.name,
                    )
                ]
            else:
                raise UnknownStageError(f"GPU executor has no op {st.op!r}")
            regions[st.name] = out
            plans.append(StagePlan(st, out, dsp, self.signature(st)))
        return plans

    def _simple(
        self,
        family: str,
        shape: PassShape,
        buffers: list,
        fmt: str,
        vals: tuple,
        workgroups: tuple[int, int, int],
        label: str,
    ) -> Dispatch:
        """One dispatch of a family's kernel: buffers bound whole in order, then a fresh uniform.
        A buffer above the binding limit is a PromptTooLongError naming the stage (`label`)."""
        for b in buffers:  # outputs were checked in _region; this catches the inputs and the KV cache
            if b.size > self.binding_limit:
                self._check_binding(label, b.size, shape, f"a {family} operand ({b.label or 'buffer'})")
        pipe = self.pipeline(family, shape)
        return Dispatch(pipe, bind(self.gpu, pipe, [*buffers, uniform(self.gpu, fmt, *vals)]), workgroups, label)

    def _add(self, a, b, out, n: int, period: int, label: str, shape: PassShape, out_offset: int = 0) -> Dispatch:
        """out[out_offset + i] = a[i] + b[i % period] for i < n (offsets in floats)."""
        vals = (n, period, out_offset, 0)
        return self._simple("add", shape, [a, b, out], "<IIII", vals, grid(-(-n // 64)), label)

    def _plan_attn_ctx(
        self, st: Stage, regions: dict[str, Region], cache: GpuKVCache, out: Region, shape: PassShape, fused: bool
    ) -> Dispatch:
        P, T, n_keys = st.params, shape.T, shape.n_past + shape.T
        if fused:
            q = regions[f"blk.{st.layer}.q_rope"]
            vals = (
                T,
                n_keys,
                shape.n_past,
                P["n_heads"],
                P["n_kv_heads"],
                P["head_dim"],
                self.cfg.layer_window(st.layer) or 0,
                self.cfg.attn_scale,
            )
            bufs = [q.buffer, cache.k[st.layer], cache.v[st.layer], out.buffer]
            n_wg = self.variant("attn_ctx").workgroup_count(T, P["n_heads"], out.size)
            return self._simple("attn_ctx", shape, bufs, "<IIIIIIIf", vals, grid(n_wg), st.name)
        a = regions[st.inputs[0]]
        vals = (T, n_keys, P["n_heads"], P["n_kv_heads"], P["head_dim"], 0, 0, 0)
        return self._simple(
            "attn_ctx",
            shape,
            [a.buffer, cache.v[st.layer], out.buffer],
            "<IIIIIIII",
            vals,
            grid(-(-out.size // 64)),
            st.name,
        )

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
        src = self.variant(self.family(st)).source(PassShape(T, cache.n_past))
        keep = self.variant("lm_head").window_filter if st.name == "logits" else None
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
            max_binding=self.binding_limit,
            window_filter=keep,  # per weight window, whatever the token chunks
        )
        if st.bias:  # the biased output may live inside the cache (v at n_past): pass its offset
            shape = PassShape(T, cache.n_past)
            bias = self.vector(st.bias)
            dsp.append(self._add(target.buffer, bias, out.buffer, rows_T * N, N, st.name, shape, out.offset))
        return out, dsp

    # ----- running
    def embed_input(self, ids: list[int]) -> wgpu.GPUBuffer:
        """Embedding rows of the new tokens, read from the mapped file (only those rows)."""
        t = self.gguf.tensors["token_embd.weight"]
        rows = dequantize_rows(
            self.gguf.raw("token_embd.weight"), t.ggml_type, t.n_cols, np.asarray(ids, dtype=np.int64)
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
        patch: dict[str, Patch] | None = None,
        previous: PassResult | None = None,
    ) -> PassResult:
        """One forward pass of `ids`: batched (one encoder), stepped (one submit per stage), or cut
        after each patched stage so the patch can be applied on the host and written back.

        With `previous` (a result for the same ids on the same cache), only the stages from the
        first one whose variants changed are recomputed; earlier regions still hold their data."""
        t0 = time.perf_counter()
        T = len(ids)
        patch = dict(patch or {})
        known = {s.name for s in self.graph}
        unknown = [n for n in patch if n not in known]
        if unknown:
            raise UnknownStageError(f"cannot patch unknown stage(s): {', '.join(unknown)}")
        if names is not None:
            names = list(names)
            unknown = [n for n in names if n not in known]
            if unknown:
                raise UnknownStageError(
                    f"names filter has unknown stage(s): {', '.join(unknown)}; stages are e.g. "
                    f"{', '.join(s.name for s in self.graph[:6])}, ..."
                )
        start, recomputed_from = 0, None
        if previous is not None and not debug and not patch:
            cache.n_past -= T  # the previous pass advanced it
            new_sigs = [self.signature(st) for st in self.graph]
            # no switch since the last pass: recompute it all (same regions), don't replay old data
            start = next((i for i, (p, s) in enumerate(zip(previous.plans, new_sigs)) if p.signature != s), 0)
            embed_in = self.embed_input(ids) if start == 0 else None
            plans = self.plan(T, cache, embed_in, last_logits_only, reuse=previous.plans, start=start)
        else:
            plans = self.plan(T, cache, self.embed_input(ids), last_logits_only)
        if start < len(plans):
            recomputed_from = plans[start].stage.name
        not_run = [p.stage.name for p in plans if p.skipped and p.stage.name in patch]
        if not_run:
            raise UnknownStageError(
                f"cannot patch {', '.join(not_run)}: the selected attn_ctx variant "
                f"{self.variants.get('attn_ctx', 'default')!r} does not compute it"
            )
        want = {p.stage.name for p in plans} if names is None else set(names)
        captured = [p for p in plans if (p.stage.name in want or debug) and not p.skipped]
        if debug:
            for p in plans:
                if not p.skipped:
                    poison_region(self.device, p.out)
        t1 = time.perf_counter()
        todo = plans[start:]
        stage_ms: dict[str, float] = {}
        segments = _segments(todo, set(patch), stepped)
        qs = None
        if timestamps and self.gpu.has_timestamps and len(segments) == 1 and todo:
            qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * len(todo))
        for k, seg in enumerate(segments):
            enc = self.device.create_command_encoder()
            if qs is None:  # no per-stage timestamps: every dispatch of the segment in one compute pass
                record_stages(enc, seg)
            else:
                for j, p in enumerate(seg):
                    record_stage(enc, p, qs, j)
            last = k == len(segments) - 1
            staging = offsets = None
            ts_buf = None
            if last:
                staging, offsets = record_captures(self.device, enc, captured)
                if qs is not None:
                    ts_buf = self.device.create_buffer(
                        size=16 * len(todo), usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
                    )
                    enc.resolve_query_set(qs, 0, 2 * len(todo), ts_buf, 0)
            self.device.queue.submit([enc.finish()])
            tail = seg[-1] if seg else None
            if tail is not None and tail.stage.name in patch:
                self._apply_patch(tail, patch[tail.stage.name])
            if last:
                caps = read_captures(staging, offsets, captured)
                if ts_buf is not None:
                    ticks = np.frombuffer(self.device.queue.read_buffer(ts_buf), dtype=np.uint64).reshape(-1, 2)
                    stage_ms = {p.stage.name: float(e - s) / 1e6 for p, (s, e) in zip(todo, ticks)}
        if not segments:
            caps = _read_now(self.device, captured)
        t2 = time.perf_counter()
        cache.n_past += T
        unwritten = {}
        if debug:
            unwritten = {n: poison_count(a) for n, a in caps.items()}
            caps = {n: a for n, a in caps.items() if n in want}
        timings = {"plan_s": t1 - t0, "gpu_s": t2 - t1, "total_s": t2 - t0}
        return PassResult(caps, unwritten, timings, stage_ms, plans, recomputed_from)

    def _apply_patch(self, p: StagePlan, fn: Patch) -> None:
        """Read a stage's output, let `fn` change it, write it back where the next stages read it."""
        cur = _read_now(self.device, [p])[p.stage.name]
        new = np.asarray(fn(cur.copy(), p.stage.name), dtype=np.float32)
        if new.shape != cur.shape:
            raise ValueError(f"patch for {p.stage.name} returned shape {new.shape}, expected {cur.shape}")
        self.device.queue.write_buffer(p.out.buffer, 4 * p.out.offset, np.ascontiguousarray(new).tobytes())


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _segments(todo: list[StagePlan], cut_after: set[str], stepped: bool) -> list[list[StagePlan]]:
    """Split the stages into submits: after every stage when stepped, else after each patched stage."""
    segs, cur = [], []
    for p in todo:
        cur.append(p)
        if stepped or p.stage.name in cut_after:
            segs.append(cur)
            cur = []
    if cur or not segs:
        segs.append(cur)
    return segs


def record_stages(enc, plans: list[StagePlan]) -> None:
    """All dispatches of several stages in one compute pass. WebGPU makes each dispatch its own
    usage scope, so a stage still sees everything the stages before it wrote; one pass instead of
    one per stage saves lavapipe's per-pass cost (about 0.3 ms a stage, most of a decode step)."""
    cp = enc.begin_compute_pass()
    for plan in plans:
        for d in plan.dispatches:
            cp.set_pipeline(d.pipeline)
            cp.set_bind_group(0, d.bind_group)
            cp.dispatch_workgroups(*d.workgroups)
    cp.end()


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
    return {
        p.stage.name: raw[off : off + 4 * p.out.size].view(np.float32).reshape(p.out.shape).copy()
        for p, off in zip(plans, offsets)
    }


def _read_now(device, plans: list[StagePlan]) -> dict[str, np.ndarray]:
    enc = device.create_command_encoder()
    staging, offsets = record_captures(device, enc, plans)
    device.queue.submit([enc.finish()])
    return read_captures(staging, offsets, plans)
