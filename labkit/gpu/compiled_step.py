"""One compiled decode step: a step's dispatches recorded once, and the few words that move per step.

Two decode steps of one capture and kernel selection differ only in the step's token and position.
A `CompiledStep` is made by planning the step afresh at three positions (n, n+1, n+2) over one
`PlanCache` whose uniforms are slots of one `UniformArena`: every pipeline, bind group, region and
uniform slot must come out the same object each time, and what differs must be

- a uniform word of a field the dispatch's op declares as moving with the step (`Op.step_fields`:
  rope's `pos0`, attention's `n_keys`, the KV writers' `y_offset`, ...), changing by the same amount
  each step: stored as `base + step * n_past`;
- a workgroup count the op computes from the position (`Op.step_workgroups`: the decode scores
  kernel's key workgroups), which the op's rule gives again each step;
- the embedding's rows, which the step writes for its token.

A warm step then writes those words into the arena's host copy (one `queue.write_buffer` for all),
the token's embedding row into its buffer, and submits the kept dispatches: no planning, no GPU object
made. Its moving words and its encoder (the dispatches and the copies of its captures) do not depend
on its token, so the step before writes and records them while the GPU runs it (`Ahead`, taken by
labkit.gpu.submitter's `submit_step`): what is left between a token and its step's submit is the
token's row. It does so where the host has a core the device leaves free (`GpuDevice.has_spare_core`).
Regions that grow with the keys (the attention maps) hold the power of two at or above what the step
needs (`PlanCache`'s rounding), so the step holds until the keys outgrow them.

A compiled step binds one sequence's KV cache, so it is that sequence's `PassState.step`.
`CompiledSteps.get` is the one place that decides whether it still holds: the same kernel
selection (variants, adapter, weight layout, registered variants), the same capture, the same KV
cache, and room for one more key in every grown region. Anything else compiles again, and a step that
cannot be compiled (an object that differs, a word no op declares) runs planned afresh, each time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from labkit.gpu.dispatch import grid, native_commands, native_recording
from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import StagePlan
from labkit.gpu.plan_cache import PlanCache, UniformArena
from labkit.gpu.planner import plan_pass
from labkit.model.dequant import dequantize_rows
from labkit.ops import OPS
from labkit.ops.base import wgsl_params

if TYPE_CHECKING:
    from labkit.gpu.device import GpuDevice

COMPILE_AT = 3  # positions a step is planned at to be compiled: one more than an affine rule needs


@dataclass
class Moving:
    """The words of the arena that move with the step: value = base + step * n_past (uint32)."""

    words: np.ndarray  # word indices into the arena
    base: np.ndarray  # int64
    step: np.ndarray  # int64


@dataclass
class StepWorkgroups:
    """A dispatch whose workgroup count its op computes from the position each step."""

    plan: int  # index into the plans
    dispatch: int  # index into that plan's dispatches
    source: str
    command: int = 0  # index into the step's native commands
    delta: int = 0  # a batch's dispatch: its sequence's position less the first sequence's


@dataclass
class CompiledStep:
    key: tuple  # what it was compiled under (see CompiledSteps.get)
    kv: GpuKVCache  # the KV cache its plans bind
    plans: list[StagePlan]
    objects: PlanCache  # what the plans bind: buffers, bind groups, uniform slots
    moving: Moving
    workgroups: list[StepWorkgroups]
    embed: list[tuple[Any, str]]  # (rows buffer, embedding tensor) of the stages that read the token
    max_keys: int  # the keys the grown regions hold
    captured: list[StagePlan]  # the plans whose regions the step reads back (its capture is part of its key)
    commands: list[list] | None = None  # every dispatch as wgpu-native handles (labkit.gpu.dispatch.native_commands)
    moving_stages: frozenset[str] = frozenset()  # the stages whose uniform words move (tests, profiling)
    steps: int = field(default=0)  # steps taken (tests, profiling)
    values_at: int | None = None  # the position whose moving words the arena holds now
    ahead: Ahead | None = None  # the next step, recorded while this one ran (labkit.gpu.submitter)
    took_ahead: bool = False  # whether the last step submitted an encoder recorded ahead
    # a batch's step: every sequence's cache, the first being `kv` (each advances one position a step)
    kvs: list[GpuKVCache] = field(default_factory=list)

    def holds(self, key: tuple, kvs: list[GpuKVCache]) -> bool:
        same = len(kvs) == len(self.caches) and all(a is b for a, b in zip(kvs, self.caches))
        return key == self.key and same and self.runs_at(self.kv.n_past)

    @property
    def caches(self) -> list[GpuKVCache]:
        return self.kvs or [self.kv]

    def runs_at(self, n_past: int) -> bool:
        """Whether a step after `n_past` positions (the first sequence's) fits: every sequence's keys in
        the grown regions and its KV cache."""
        return all(n_past + kv.n_past - self.kv.n_past + 1 <= min(self.max_keys, kv.capacity) for kv in self.caches)

    def prepare(self, ex: Any, tokens: list[int]) -> list[StagePlan]:
        """This step's values written (unless the step before wrote them ahead) and its tokens'
        embedding rows (a batch's: one a sequence); its plans. The moving workgroup counts are set where
        its encoder is recorded (labkit.gpu.submitter's `submit_step`)."""
        self.write_values(self.kv.n_past)
        for buf, name in self.embed:
            t = ex.gguf.tensors[name]
            rows = dequantize_rows(ex.gguf.raw(name), t.ggml_type, t.n_cols, np.array(tokens, dtype=np.int64))
            ex.device.queue.write_buffer(buf, 0, rows.astype(np.float32).tobytes())
        self.steps += 1
        return self.plans

    @cached_property
    def n_dispatches(self) -> int:
        return sum(len(p.dispatches) for p in self.plans)  # the plans are the step's for its life

    def write_values(self, n_past: int) -> None:
        """The moving words of the step after `n_past` positions, flushed to the arena in one write.
        The queue orders the write after every step submitted before it, so the step before may
        write them while it runs on the GPU."""
        if self.values_at == n_past:
            return
        arena = self.objects.arena
        words = np.frombuffer(arena.host, dtype=np.uint32)
        m = self.moving
        if m.words.size:
            words[m.words] = (m.base + m.step * n_past).astype(np.uint32)
            arena.touch(int(m.words.min()) * 4, int(m.words.max()) * 4 + 4)
        arena.flush()
        self.values_at = n_past

    def _counts(self, w: StepWorkgroups, n_past: int) -> tuple[int, int, int]:
        """A moving dispatch's workgroup count at the step after `n_past` positions (its op's rule)."""
        plan = self.plans[w.plan]
        st = plan.stage
        return grid(OPS[plan.dispatches[w.dispatch].op or st.op].step_workgroups(st, w.source, 1, n_past + w.delta))

    def set_workgroups(self, n_past: int) -> None:
        """The workgroup counts that move with the position, in the plans and the native commands."""
        for w in self.workgroups:
            d = self.plans[w.plan].dispatches[w.dispatch]
            d.workgroups = self._counts(w, n_past)
            if self.commands is not None:
                self.commands[w.command][3:6] = d.workgroups

    def commands_at(self, n_past: int) -> list[list] | None:
        """The native commands with the workgroup counts of the step after `n_past` positions, in a
        list of their own (the plans keep the counts of the step that ran); None without native recording."""
        if self.commands is None:
            return None
        out = list(self.commands)
        for w in self.workgroups:
            out[w.command] = [*out[w.command][:3], *self._counts(w, n_past)]
        return out

    def take_ahead(self, n_past: int, staging: Any) -> Ahead | None:
        """The step's command buffer recorded ahead, if it was for this position and reads back
        through `staging` (the submitter's now); it is given out once."""
        ahead, self.ahead = self.ahead, None
        held = ahead is not None and ahead.n_past == n_past and ahead.staging is staging
        self.took_ahead = held
        return ahead if held else None


@dataclass
class Ahead:
    """The next step's command buffer, recorded while the step before it ran on the GPU: the
    dispatches at `n_past`'s workgroup counts, and the copies of its captures into `staging`.
    Recording is a pure function of those, so it is the buffer the step would record itself."""

    n_past: int
    buffer: Any  # a finished GPUCommandBuffer, not yet submitted
    readback: Any  # labkit.gpu.readback.Readback of the captures, None when nothing is read
    staging: Any


class CompiledSteps:
    """The executor's compiler of decode steps, and the one judge of whether a state's step holds (`get`)."""

    def __init__(self, gpu: GpuDevice, round_limit: int, n_stages: int):
        self.gpu, self.round_limit, self.n_stages = gpu, round_limit, n_stages
        self.last: CompiledStep | None = None  # the step run last (tests, profiling)
        self.compiled = 0  # steps compiled so far (tests, profiling)
        self.refused = ""  # why the last compile was refused, if it was

    def get(self, ex: Any, key: tuple, ids, kv: GpuKVCache | list[GpuKVCache], held: CompiledStep | None,
            last_only: bool, names: list[str], extra: tuple = ()) -> CompiledStep | None:  # fmt: skip
        """The compiled step for this one-token step on `kv` (or a batch's step of one token for each
        of the caches `kv` lists): `held` (the sequence's, PassState.step) when it still holds, else one
        compiled now; None when the step cannot be compiled (it is then planned afresh). The caller
        keeps what it returns as the sequence's step."""
        kvs = kv if isinstance(kv, list) else [kv]
        step = held if held is not None and held.holds(key, kvs) else None
        if step is None and all(c.n_past + COMPILE_AT <= c.capacity for c in kvs):
            step = self._compile(ex, key, ids, kvs, last_only, set(names), extra)
        self.last = step
        return step

    def _compile(self, ex, key, ids, kvs: list[GpuKVCache], last_only, names: set[str], extra: tuple = ()
                 ) -> CompiledStep | None:  # fmt: skip
        from labkit.gpu.batch_plan import segments_of

        arena = UniformArena(self.gpu.device, capacity=max(64, 2 * self.n_stages * len(kvs)) * UniformArena.ALIGN)
        objects = PlanCache(self.gpu, self.round_limit, arena)
        kv, room = kvs[0], max(c.capacity for c in kvs)
        passes, snaps = [], []
        for k in range(COMPILE_AT):
            for c in kvs:
                c.advance(k)
            try:
                segments = segments_of([[t] for t in ids], kvs) if len(kvs) > 1 else None
                with objects.one_pass():
                    passes.append(plan_pass(ex, ids, kv, objects, last_only, fuse=True, keys_room=room,
                                            segments=segments, extra=extra))  # fmt: skip
            finally:
                for c in kvs:
                    c.rewind(k)
            snaps.append(np.frombuffer(bytes(arena.host), dtype=np.uint32).astype(np.int64))
        why = _same_objects(passes)
        sources = {id(p): src for (src, _), p in ex.gpu.pipelines.items()}
        if not why and objects.own_uniforms:
            why = "the arena is full: some uniforms are buffers of their own"
        moving, why = (None, why) if why else _moving_words(passes[0], snaps, arena, sources, kv.n_past)
        groups, why = (None, why) if why else _step_workgroups(passes, sources, kv.n_past)
        if why:
            self.refused = why
            return None
        plans = passes[0]
        if any(p.parts and p.stage.name in names for p in plans):
            self.refused = "a batch's capture of a per-sequence output"
            return None
        embed = [(p.dispatches[0].resources[0], p.stage.weight) for p in plans if p.reads_ids]
        self.compiled += 1
        owners = _word_fields(plans, arena, sources)
        movers = frozenset(owners[int(w)][0].name for w in moving.words)
        commands = _commands(plans, groups)
        captured = [p for p in plans if p.stage.name in names and not p.skipped]
        return CompiledStep(key, kv, plans, objects, moving, groups, embed, _max_keys(plans), captured, commands,
                            movers, kvs=kvs if len(kvs) > 1 else [])  # fmt: skip


def _same_objects(passes: list[list[StagePlan]]) -> str:
    """Why the plans of the three positions are not over the same objects, or ""."""
    first = passes[0]
    for other in passes[1:]:
        if len(other) != len(first):
            return "another number of stages"
        for a, b in zip(first, other):
            if a.out.buffer is not b.out.buffer or len(a.dispatches) != len(b.dispatches) or a.chunks:
                return f"{a.stage.name}: another region or dispatch count"
            for da, db in zip(a.dispatches, b.dispatches):
                if da.pipeline is not db.pipeline or da.bind_group is not db.bind_group:
                    return f"{a.stage.name}: another pipeline or bind group"
    return ""


def _moving_words(plans: list[StagePlan], snaps: list[np.ndarray], arena: UniformArena, sources: dict, n0: int):
    """The arena words that change with the position, each a declared step field changing by the
    same amount each step: (Moving, "") or (None, why)."""
    changed = np.flatnonzero((snaps[0] != snaps[1]) | (snaps[1] != snaps[2]))
    step = snaps[1][changed] - snaps[0][changed]
    if np.any(snaps[2][changed] - snaps[1][changed] != step):
        return None, "a uniform word that does not move by the same amount each step"
    owner = _word_fields(plans, arena, sources)
    for w in changed:
        stage, name, op = owner.get(int(w), (None, None, ""))
        if stage is None or name not in OPS[op or stage.op].step_fields:
            return None, f"{stage.name if stage else 'a word'}: {name or 'an unowned word'} moves, not a step field"
    return Moving(changed.astype(np.int64), snaps[0][changed] - step * n0, step), ""  # snaps[0]: at n0


def _word_fields(plans: list[StagePlan], arena: UniformArena, sources: dict) -> dict[int, tuple]:
    """Arena word index -> (the stage, the Params field, the dispatch's own op or "") of every dispatch whose
    uniform is a slot."""
    out = {}
    for p in plans:
        for d in p.dispatches:
            if not d.resources or d.resources[-1][0] is not arena.buffer:
                continue
            _, offset, size = d.resources[-1]
            names = [n for n, _ in wgsl_params(sources.get(id(d.pipeline), ""))]
            for j in range(size // 4):
                out[offset // 4 + j] = (p.stage, names[j] if j < len(names) else None, d.op)
    return out


def _step_workgroups(passes: list[list[StagePlan]], sources: dict, n_past: int):
    """The dispatches whose workgroup count moves with the position: ([StepWorkgroups], "") when
    their op gives the count again (`Op.step_workgroups`) for every position planned, else (None, why)."""
    out = []
    for i, plans in enumerate(zip(*passes)):
        for j, ds in enumerate(zip(*(p.dispatches for p in plans))):
            op = OPS[ds[0].op or plans[0].stage.op]
            if len({d.workgroups for d in ds}) == 1 and op.step_workgroups is None:
                continue
            st, source = plans[0].stage, sources.get(id(ds[0].pipeline), "")
            rule = op.step_workgroups
            if rule is None:
                return None, f"{st.name}: its workgroups move with the step and its op has no rule for them"
            delta = 0 if ds[0].n_past is None else ds[0].n_past - n_past  # a batch's sequence: its own position
            if any(grid(rule(st, source, 1, n_past + delta + k)) != d.workgroups for k, d in enumerate(ds)):
                return None, f"{st.name}: its op's workgroup rule does not give the planned counts"
            out.append(StepWorkgroups(i, j, source, delta=delta))
    return out, ""


def _commands(plans: list[StagePlan], groups: list[StepWorkgroups]) -> list[list] | None:
    """The step's dispatches as native commands, each moving workgroup count told where it is in them;
    None where wgpu-py's own methods record (no native functions)."""
    if not native_recording():
        return None
    first = np.cumsum([0] + [len(p.dispatches) for p in plans])
    for g in groups:
        g.command = int(first[g.plan]) + g.dispatch
    return native_commands([d for p in plans for d in p.dispatches])


def _max_keys(plans: list[StagePlan]) -> int:
    """The keys every attention map's buffer holds (its power-of-two rounding), so the step holds
    until one more key would outgrow one."""
    maps = [r for p in plans for r in (p.parts or [p.out]) if r.layout == "heads"]
    return min((r.buffer.size // (4 * math.prod(r.shape[:-1])) for r in maps), default=1 << 62)
