"""The GPU executor: runs a model's stage graph on WebGPU, batched or one stage at a time.

The planner (labkit.gpu.planner) is one loop over the graph: each stage's op module
(labkit.ops) says what to dispatch through a `StageContext`, which the executor, a
`StageHost` (labkit.gpu.stage_host), turns into pipelines, uniform buffers and bind groups. The
executor adds what a pass needs (weights through the weight store, the kernel selection) and runs
passes: plan, submit, read back. Every stage writes its own output region (a stage with
`kv_write` writes straight into its layer's KV cache), so nothing is overwritten within a
pass: captures are plain copies recorded at the end of the same command encoder, and a
batched run reads back exactly what a stepped run reads. In debug mode every output
region is filled with a poison bit pattern before the pass; poison left afterwards is
"unwritten". Stages nothing reads under the selected kernels (scores and probabilities
under a fused attention tier) are `skipped`: no dispatch, never captured.

Matmuls bind X and Y per chunk of tokens when a buffer is bigger than one storage
binding (Gemma's [T, 262144] logits); every other kernel binds its buffers whole, so a
region above the limit is a BufferLimitError (a GpuLimitError and a PromptTooLongError) at
plan time, not a GPU validation error.

Because regions outlive the pass, a re-run of the same tokens after a variant switch
re-records only the stages from the first one whose kernel, policy or skip changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import wgpu

from labkit.errors import InvalidArgumentError, UnknownStageError
from labkit.gpu import scratch as scratch_regions
from labkit.gpu.allocator import Allocator, FreshObjects
from labkit.gpu.batch_plan import part_plans, segments_of
from labkit.gpu.compiled_step import CompiledStep, CompiledSteps
from labkit.gpu.device import GpuDevice, get_device
from labkit.gpu.dispatch import (
    Dispatch,
)
from labkit.gpu.kernel_selection import (
    KernelChoice,
    SelectedKernels,
    SelectionKey,
    choose,
    select_kernels,
)
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import Region, StagePlan
from labkit.gpu.pass_request import BatchState, PassRequest, PassState
from labkit.gpu.plan_cache import PlanCache
from labkit.gpu.planner import plan_pass, plans_under
from labkit.gpu.reuse import Reuse
from labkit.gpu.stage_context import PassScope, StageContext
from labkit.gpu.stage_host import STORAGE, StageHost
from labkit.gpu.submitter import Submitter, clear_regions, poison_region, record_stage
from labkit.gpu.weight_store import shared_store
from labkit.gpu.weights import GpuWeight
from labkit.model.batch_stages import per_sequence
from labkit.model.cache_stages import stored_types
from labkit.model.config import ModelConfig
from labkit.model.dequant import dequantize_rows
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage
from labkit.ops import OPS
from labkit.ops.base import Kernel
from labkit.ops.kv_cache import row_words
from labkit.ops.registry import check_selection, registry_generation
from labkit.poison import POISON_BITS, poison_count
from labkit.progress import bar

__all__ = [
    "POISON_BITS", "GpuExecutor", "GpuKVCache", "PassRequest", "PassState", "Region", "StagePlan", "poison_count",
    "poison_region", "record_stage",
]  # fmt: skip

UPLOAD_BAR_MB = 256  # a first pass moving fewer megabytes of weights shows no bar


@dataclass
class PassResult:
    captures: dict[str, np.ndarray]
    unwritten: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stage_ms: dict[str, float] = field(default_factory=dict)
    plans: list[StagePlan] = field(default_factory=list, repr=False)
    recomputed_from: str | None = None
    positions: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rows held by cut captures
    heads: dict[str, tuple[int, ...]] = field(default_factory=dict)  # heads held by cut attention maps
    # a later pass of the same ids may rerun this one from its middle (Reuse.rerun): every stage
    # had its own region, and no poison, patch or step cut it
    reusable: bool = True


@dataclass
class BatchResult:
    """A batch pass's captures, one dict per sequence, and the pass's timings."""

    captures: list[dict[str, np.ndarray]]
    timings: dict[str, float] = field(default_factory=dict)
    stage_ms: dict[str, float] = field(default_factory=dict)


class GpuExecutor(StageHost):
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
        super().__init__(gpu or get_device(), variants)  # variants: the Lab's own dict, shared
        check_selection(self.variants)
        self.store = shared_store(self.gpu, gguf)
        self._plan_caches: dict[str, PlanCache] = {}  # role ("prefill", "run") -> its plan cache
        self._stages = {st.name: st for st in graph}
        self.compiled_steps = CompiledSteps(self.gpu, self.binding_limit // 4, len(graph))
        self._selection: tuple = (None, None)  # (variants and adapter, what `selection` worked out)
        self.submitter = Submitter(self.device, self.gpu.has_timestamps)  # records, submits, reads back
        self.submitter.record_ahead = self.gpu.has_spare_core  # a look-ahead only where a core is free for it
        self.window_bytes: int | None = None  # force smaller weight windows (teaching, tests)
        # "repacked": default matmuls read the int8 layout (fast on lavapipe); "gguf": the raw-bytes
        # kernels, weights at their file size (what the lab picks when the repacked ones do not fit)
        self.weight_layout = "repacked"
        # greedy decode picks its token on the device (4 bytes read back a step) on a real GPU; lavapipe reads
        # the logits row back (host memory: a copy) and picks on the host, 3 to 5 % faster (PassRequest.pick).
        # None: by the adapter; True or False forces it (tests, benches).
        self.pick_on_device: bool | None = None

    # ----- weights (labkit.gpu.weight_store, shared by the executors of one file)
    def weight(self, name: str, rows: tuple[int, int] | None = None) -> GpuWeight:
        """A matmul weight (or a row range of one): GGUF bytes uploaded unchanged, in row windows."""
        return self.store.raw(name, rows, self.window_bytes)

    def repacked(self, name: str, rows: tuple[int, int] | None, source: str) -> GpuWeight:
        """A matmul weight repacked on the GPU by `source`, once per weight and reader."""
        return self.store.repacked(name, rows, source, self.binding_limit, self.window_bytes)

    def expert_weight(self, name: str, rows_per_expert: int) -> GpuWeight:
        """A 3-D expert tensor's GGUF bytes, in windows of whole experts."""
        return self.store.experts(name, rows_per_expert, self.window_bytes)

    def matmul_weight(self, st: Stage, kernel: Kernel) -> GpuWeight:
        """The weight as the kernel reads it: repacked by its repack source, or GGUF bytes."""
        if kernel.repack is not None:
            return self.repacked(st.weight, st.weight_rows, kernel.repack())
        return self.weight(st.weight, st.weight_rows)

    def vector(self, name: str) -> wgpu.GPUBuffer:
        """A 1-D tensor (norm weight, bias) as f32."""
        return self.store.vector(name)

    @property
    def upload_seconds(self) -> float:
        return self.store.upload_seconds

    def upload_all(self) -> None:
        """Put every weight on the GPU now, as the selected kernels read it (otherwise on first use).
        A bar counts the megabytes when there are many (an 8B file's first pass)."""
        pending = [(st, kernel) for st, kernel in self._matrix_stages() if not self._on_device(st, kernel)]
        mb = sum(self.gguf.tensors[st.weight].nbytes for st, _ in pending) >> 20
        with closing(bar(mb, "weights to the GPU", unit="MB", min_total=UPLOAD_BAR_MB)) as b:
            for st, kernel in pending:
                if kernel.repack is not None:  # in the layout the selected kernel reads
                    self.repacked(st.weight, st.weight_rows, kernel.repack())
                else:
                    self.weight(st.weight, st.weight_rows)
                b.update(self.gguf.tensors[st.weight].nbytes >> 20)
        for st in self.graph:
            for name in (st.weight if OPS[st.op].weight == "vector" else None, st.bias):
                if name:
                    self.vector(name)

    def _matrix_stages(self):
        kernels = self.selection().kernels
        return [(st, kernels[st.name]) for st in self.graph if OPS[st.op].weight == "matrix"]

    def _on_device(self, st: Stage, kernel: Kernel) -> bool:
        source = kernel.repack() if kernel.repack is not None else None
        return self.store.holds(st.weight, st.weight_rows, source, self.binding_limit, self.window_bytes)

    def gpu_bytes(self) -> int:
        """Bytes of weight buffers on the device (host memory on lavapipe)."""
        return self.store.nbytes()

    def token_rows(self, ids, name: str, objects: Allocator) -> Region:
        """Embedding rows of the new tokens, read from the mapped file (only those rows)."""
        t = self.gguf.tensors[name]
        rows = dequantize_rows(self.gguf.raw(name), t.ggml_type, t.n_cols, np.asarray(ids, dtype=np.int64))
        buf = objects.data(rows.astype(np.float32).tobytes(), STORAGE, "embed.rows")
        return Region(buf, 0, (len(ids), t.n_cols))  # a kept buffer may be larger

    # ----- kernels, policies, what a switch invalidates (labkit.gpu.kernel_selection)
    def family(self, st: Stage) -> str:
        """The kernel family that runs a stage (per weight format for matmuls)."""
        return OPS[st.op].family_of(st, self._tensor_type)

    def _tensor_type(self, name: str) -> int:
        return self.gguf.tensors[name].ggml_type

    def selection(self) -> SelectedKernels:
        """Every stage's kernel under the current variants, adapter and weight layout: worked out
        once per selection (and registration of user variants), not every decode step."""
        key = SelectionKey(tuple(sorted(self.variants.items())), self.adapter_type, self.weight_layout,
                           registry_generation())  # fmt: skip
        if self._selection[0] != key:
            self._selection = (key, select_kernels(self.graph, self._tensor_type, self.variants, key))
        return self._selection[1]

    def choice(self, st: Stage) -> KernelChoice:
        """The kernel of a stage and why; a stage outside the graph (a case's own) is chosen alone."""
        sel = self.selection()
        if st.name in sel.choices and sel.choices[st.name].family == self.family(st):
            return sel.choices[st.name]
        return choose(st, self.family(st), self.variants, self.adapter_type, self.weight_layout)

    def kernel(self, st: Stage) -> Kernel:
        return self.choice(st).kernel

    def plan_cache(self, role: str) -> PlanCache:
        """The executor's cache for passes of one role ("prefill" for generate, "run" for a short
        lab.run): a pass reuses the buffers, uniforms and bind groups of the last one."""
        if role not in self._plan_caches:
            self._plan_caches[role] = PlanCache(self.gpu, round_limit=self.binding_limit // 4)
        return self._plan_caches[role]

    def new_cache(self, capacity: int) -> GpuKVCache:
        """K and V of `capacity` positions for each attending layer, and each recurrent layer's states (zero)."""
        cfg, fresh = self.cfg, self.gpu.fresh
        attends = set(cfg.attention_layers)

        types = stored_types(self.graph)

        def kv(kind: str) -> list:
            width = cfg.cache_dims[kind == "v"]
            n = capacity * (row_words(types[kind], width) if kind in types else width)
            return [self.buffer(n, f"cache.{kind}.{L}", fresh) if L in attends else None for L in range(cfg.n_layers)]

        states = {}
        if cfg.ssm is not None:
            sizes = {"conv": cfg.ssm.conv_state_size, "scan": cfg.ssm.scan_state_size}
            for L in cfg.state_layers:
                states |= {(kind, L): self.buffer(n, f"state.{kind}.{L}", fresh) for kind, n in sizes.items()}
        views = {k: self.buffer(capacity * cfg.cache_dims[k == "v"], f"cache.{k}.view", fresh) for k in types}
        views |= {"none": self.buffer(4, "cache.none", fresh)} if types else {}
        return GpuKVCache(capacity, kv("k"), kv("v"), states=states, types=types, views=views)

    def stage_matmul(self, st: Stage, x: Region, out: Region) -> list[Dispatch]:
        """A matmul stage's dispatches on given X and Y regions (x.shape[0] tokens), with the stage's
        selected kernel: how a case runs one weight through the real kernel."""
        scope = PassScope({}, GpuKVCache(0, [], []), range(x.shape[0]), False, self.gpu.fresh)
        return self.matmul(StageContext(self, st, self.kernel(st), scope), x, out, x.shape[0], 0, None)

    # ----- planning one pass (labkit.gpu.planner)
    def plan(self, ids: list[int], kv: GpuKVCache, last_logits_only: bool = False, **how) -> list[StagePlan]:
        """Regions and dispatches for the new tokens `ids` after kv.n_past cached ones, all new (plan_pass)."""
        return plan_pass(self, ids, kv, FreshObjects(self.gpu), last_logits_only, **how)

    # ----- running
    @property
    def unembedding_stages(self) -> set[str]:
        """The unembedding and what follows it (gemma2's softcap): the stages `last_logits_only` cuts."""
        first = next((i for i, st in enumerate(self.graph) if st.policy == "lm_head"), len(self.graph) - 1)
        return {st.name for st in self.graph[first:]}

    def check_names(self, names: Iterable[str] | None, patch: dict) -> list[str] | None:
        """UnknownStageError for a names filter or a patch naming stages the graph lacks."""
        known = self._stages
        unknown = [n for n in patch if n not in known]
        if unknown:
            raise UnknownStageError(f"cannot patch unknown stage(s): {', '.join(unknown)}")
        if names is None:
            return None
        names = list(names)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UnknownStageError(
                f"names filter has unknown stage(s): {', '.join(unknown)}; stages are e.g. "
                f"{', '.join(s.name for s in self.graph[:6])}, ..."
            )
        return names

    def new_state(self, capacity: int) -> PassState:
        """A new sequence's state: an empty KV cache of `capacity` positions (labkit.gpu.pass_request)."""
        return PassState(self.new_cache(capacity))

    def run_pass(self, request: PassRequest, state: PassState) -> PassResult:
        """One forward pass of `request.ids` after the `state.n_past` positions its KV cache holds:
        batched (one encoder), stepped (one submit per stage), or cut after each patched stage so the
        patch can be applied on the host and written back. Advances the state past the new tokens.

        `request.reuse` (labkit.gpu.reuse) names what the pass may take over from earlier ones: a
        rerun of a previous pass of the same ids on the same state recomputes only the stages from
        the first one whose kernel, policy or skip changed; objects reuse a role's buffers and bind
        groups; steps run a decode step compiled once (labkit.gpu.compiled_step). The pass takes what
        it can of it."""
        t0 = time.perf_counter()  # the step's start: host_s runs from here to the submit
        r = request
        if r.reuse.kind == "rerun":
            state.kv.rewind(r.T)  # the previous pass advanced it
        reuse = r.reuse.within(r.T, r.debug, bool(r.patch), r.stepped)
        objects = reuse.allocator(self)
        with objects.one_pass():
            return self._pass(r, state, reuse, objects, t0)

    def _pass(self, r: PassRequest, state: PassState, reuse: Reuse, objects: Allocator, t0: float) -> PassResult:
        """run_pass within its objects' pass; `t0`: when run_pass began."""
        names = self.check_names(r.names, r.patch)
        T, kv = r.T, state.kv
        last_only = r.last_logits_only or self._logits_unread(T, names, r.debug, r.patch, r.positions)
        keep, streamed = self._regions_policy(T, names, r.debug, r.patch, r.stepped)
        if reuse.kind == "steps":  # every stage keeps its own region: a compiled step holds on to it
            keep, streamed = None, None
        extra = self._picks(r, streamed)
        step = self._compiled_step(r, state, last_only, names, extra) if reuse.kind == "steps" else None
        if step is not None:
            return self._step_pass(r, state, step, t0)
        plans, start = plans_under(self, r.ids, kv, objects, last_only, reuse, keep, streamed, extra)
        not_run = [p.stage.name for p in plans if p.skipped and p.stage.name in r.patch]
        if not_run:
            raise UnknownStageError(f"cannot patch {', '.join(not_run)}: the selected kernels do not compute it")
        want = ({p.stage.name for p in plans} if names is None else set(names)) | {st.name for st in extra}
        captured = [p for p in plans if (p.stage.name in want or r.debug) and not p.skipped]
        if r.debug:
            for p in plans:
                if not p.skipped and p.out.layout != "state":  # a state is the pass's input too
                    poison_region(self.device, p.out)
        elif reuse.kind == "objects":
            clear_regions(self.device, plans)  # reused buffers start as fresh ones do: a run never sees the last one
        t1 = time.perf_counter()
        todo = plans[start:]
        caps, held, held_heads, stage_ms = self.submitter.submit(todo, captured, r, objects)
        t2 = time.perf_counter()
        kv.advance(T)
        unwritten = {}
        if r.debug:
            unwritten = {n: poison_count(a) for n, a in caps.items()}
            caps = {n: a for n, a in caps.items() if n in want}
        n_dispatches = sum(len(p.dispatches) for p in todo)
        timings = {"plan_s": t1 - t0, "gpu_s": t2 - t1, "total_s": t2 - t0,
                   "host_s": self.submitter.submit_at - t0, "dispatches": n_dispatches,
                   "readback_bytes": sum(a.nbytes for a in caps.values())}  # fmt: skip
        recomputed_from = plans[start].stage.name if start < len(plans) else None
        # a recurrent state has moved on: a rerun of the pass would start from where this one left it
        rerunnable = keep is None and not r.debug and not r.patch and not r.stepped and not kv.states
        return PassResult(caps, unwritten, timings, stage_ms, plans, recomputed_from, held, held_heads, rerunnable)

    @cached_property
    def per_sequence(self) -> frozenset[str]:
        """The stages a batch runs once per sequence (labkit.model.batch_stages)."""
        return per_sequence(self.graph)

    def run_batch_pass(self, seqs: list[list[int]], batch: BatchState, names: list[str] | None = None,
                       timestamps: bool = False) -> BatchResult:  # fmt: skip
        """One pass of several sequences' new tokens packed on one axis (labkit.gpu.batch_plan), each
        continuing its own state; the captures read back and cut per sequence. Advances every state. A
        decode step (one token each, named captures) runs the batch's compiled step (`batch.step`)."""
        t0 = time.perf_counter()
        names = self.check_names(names, {})
        kvs = [s.kv for s in batch.states]
        if len({id(kv) for kv in kvs}) != len(kvs):
            raise InvalidArgumentError("a batch's sequences each need their own state")
        segments = segments_of(seqs, kvs)
        ids = [t for seq in seqs for t in seq]
        step = None
        if all(len(s) == 1 for s in seqs) and names is not None and not timestamps:
            self.selection()
            key = (self._selection[0], "batch", tuple(names))
            batch.step = step = self.compiled_steps.get(self, key, ids, kvs, batch.step, False, names)
        if step is not None:
            step.prepare(self, ids)
            t1 = time.perf_counter()
            caps, _, _, stage_ms = self.submitter.submit_step(step, PassRequest(tuple(ids), names=names))
            plans, captured = step.plans, step.captured
        else:
            caps, stage_ms, plans, captured, t1 = self._batch_planned(ids, segments, names, timestamps)
        t2 = time.perf_counter()
        for seg in segments:
            seg.kv.advance(seg.T)
        per_seq = [{} for _ in segments]
        for p in captured:
            for k, seg in enumerate(segments):
                name = p.stage.name
                per_seq[k][name] = caps[f"{name}#{k}"] if p.parts else caps[name][seg.start : seg.start + seg.T]
        n_dispatches = sum(len(p.dispatches) for p in plans)
        timings = {"plan_s": t1 - t0, "gpu_s": t2 - t1, "total_s": t2 - t0, "dispatches": n_dispatches,
                   "compiled": float(step is not None)}  # fmt: skip
        return BatchResult(per_seq, timings, stage_ms)

    def _batch_planned(self, ids: list[int], segments, names, timestamps: bool):
        """A batch pass planned afresh over the batch role's objects, submitted and read back."""
        objects = self.plan_cache("batch")
        with objects.one_pass():
            plans = plan_pass(self, ids, segments[0].kv, objects, segments=segments)
            clear_regions(self.device, plans)
            want = {p.stage.name for p in plans} if names is None else set(names)
            captured = [p for p in plans if p.stage.name in want and not p.skipped]
            reading = [q for p in captured for q in (part_plans(p) if p.parts else [p])]
            t1 = time.perf_counter()
            request = PassRequest(tuple(ids), timestamps=timestamps)
            caps, _, _, stage_ms = self.submitter.submit(plans, reading, request, objects)
        return caps, stage_ms, plans, captured, t1

    def _step_pass(self, r: PassRequest, state: PassState, step: CompiledStep, t0: float) -> PassResult:
        """A decode step through its compiled step: its token written, its encoder submitted (recorded
        by the step before when it could be), its captures read back; nothing planned."""
        plans = step.prepare(self, list(r.ids))
        t1 = time.perf_counter()
        caps, held, held_heads, stage_ms = self.submitter.submit_step(step, r)
        t2 = time.perf_counter()
        state.kv.advance(1)
        timings = {"plan_s": t1 - t0, "gpu_s": t2 - t1, "total_s": t2 - t0,
                   "host_s": self.submitter.submit_at - t0, "dispatches": step.n_dispatches,
                   "recorded_ahead": float(step.took_ahead),
                   "readback_bytes": sum(a.nbytes for a in caps.values())}  # fmt: skip
        rerunnable = not state.kv.states  # a recurrent state has moved on: a rerun would start from there
        return PassResult(caps, {}, timings, stage_ms, plans, plans[0].stage.name, held, held_heads, rerunnable)

    def _compiled_step(self, r: PassRequest, state: PassState, last_only: bool, names,
                       extra: tuple[Stage, ...] = ()) -> CompiledStep | None:  # fmt: skip
        """A decode step's compiled step (labkit.gpu.compiled_step), when the pass is one: one token,
        a named capture that holds no KV writer's region (it moves each step), no timestamps."""
        if r.T != 1 or names is None or r.timestamps:
            return None
        if any(self._stages[n].kv_write for n in names):
            return None
        self.selection()
        key = (self._selection[0], last_only, tuple(names), r.positions, r.heads, r.pick)
        names = [*names, *(st.name for st in extra)]
        state.step = self.compiled_steps.get(self, key, r.ids, state.kv, state.step, last_only, names, extra)
        return state.step

    @property
    def picks_on_device(self) -> bool:
        """Whether a greedy decode step picks its token on the device (see `pick_on_device`)."""
        return self.adapter == "gpu" if self.pick_on_device is None else self.pick_on_device

    @cached_property
    def next_token_stage(self) -> Stage:
        """The greedy pick after the last stage (labkit.ops.argmax): in no graph, appended to a pass that asks."""
        last = self.graph[-1]
        return Stage("next_token", "argmax", (last.name,), params={"width": self.cfg.vocab_size})

    def _picks(self, r: PassRequest, streamed) -> tuple[Stage, ...]:
        """The stages a pass appends to pick its next token on the device: a greedy pick's argmax (not on a
        streamed pass, whose logits are read in chunks: it reads them back instead)."""
        if r.pick is None or streamed:
            return ()
        if r.pick != "greedy":
            raise InvalidArgumentError(f"pick={r.pick!r}: the device picks greedily (pick='greedy') or not at all")
        return (self.next_token_stage,)

    def _logits_unread(self, T: int, names, debug: bool, patch: dict, positions) -> bool:
        """Nothing reads the other positions' logits: not captured, or only the last position kept."""
        tail = self.unembedding_stages
        unread = names is not None and not tail & set(names)
        return not debug and not tail & set(patch) and (positions == [T - 1] or unread)

    def _regions_policy(self, T: int, names, debug: bool, patch: dict, stepped: bool):
        """(keep, streamed) for `plan`: a full capture keeps a region per stage (None); a narrowed one
        keeps the captured and patched stages', the others are scratch; a long pass streams: every
        region is scratch, the captures read back segment by segment."""
        if T >= scratch_regions.STREAM_MIN_TOKENS and not debug and not patch and not stepped:
            return set(), {st.name for st in self.graph} if names is None else set(names)
        return (None if names is None or debug else set(names) | set(patch)), None
