"""Submitting a planned pass: its stages recorded into command encoders (one, or cut at patches,
at each stage of a stepped pass and at the segment ends of a streamed one), per-stage
timestamps, patches applied between submits, and the captures read back through one staging
buffer that is kept from pass to pass (its pages stay warm).

The planner (labkit.gpu.executor) decides regions and dispatches; this module only runs them.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import wgpu

from labkit.gpu.allocator import Allocator
from labkit.gpu.chunked_logits import read_chunks
from labkit.gpu.compiled_step import Ahead, CompiledStep
from labkit.gpu.dispatch import encode, pass_timestamps, resolve_timestamps
from labkit.gpu.pass_plan import Region, StagePlan
from labkit.gpu.pass_request import PassRequest, Patch
from labkit.gpu.readback import Readback, read_now
from labkit.poison import POISON_BITS


class Submitted(NamedTuple):
    """What a submitted pass read back."""

    captures: dict[str, np.ndarray]
    positions: dict[str, tuple[int, ...]]  # rows held by cut captures
    heads: dict[str, tuple[int, ...]]  # heads held by cut attention maps
    stage_ms: dict[str, float]


class Submitter:
    """Runs planned stages on one device and reads their captures back."""

    def __init__(self, device, has_timestamps: bool):
        self.device, self.has_timestamps = device, has_timestamps
        self._staging: wgpu.GPUBuffer | None = None  # the readback staging buffer (at most STAGING_BYTES)
        self.submit_at = 0.0  # perf_counter when the last pass's last segment was handed to the queue
        # compiled steps record the next step while the device runs: where the host has a core to spare
        # (the executor sets it from GpuDevice.has_spare_core; a bench may set it to compare)
        self.record_ahead = True

    def submit(self, todo: list[StagePlan], captured: list[StagePlan], request: PassRequest,
               objects: Allocator) -> Submitted:  # fmt: skip
        """Record and submit the stages: one encoder, or cut at patches, steps and segment ends. The
        captures (only the request's positions and heads, when given) are read after the last
        segment or, in a streamed pass (segment ends set while planning), each segment's own after
        that segment, before its scratch regions serve the next. A staging buffer comes from
        `objects` when they are kept."""
        patch, timestamps, T = request.patch, request.timestamps, request.T
        cut = (request.positions, request.heads)
        segments = segments_of(todo, set(patch), request.stepped)
        streamed = any(p.segment_end for p in todo)
        timed = timestamps and self.has_timestamps and (len(segments) == 1 or streamed)
        names = {p.stage.name for p in captured}
        caps, held, held_heads, stage_ms = {}, {}, {}, {}
        staging = self._staging  # every readback goes through one staging buffer, kept pass to pass
        for k, seg in enumerate(segments):
            if streamed:  # the unembedding in chunks reads itself back (below)
                reading = [p for p in seg if p.stage.name in names and not p.chunks]
            else:
                reading = captured if k == len(segments) - 1 else []
            enc = self.device.create_command_encoder()
            qs = (
                self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * len(seg))
                if timed and seg
                else None
            )
            _record(enc, seg, qs)
            readback = Readback(self.device, reading, T, *cut) if reading else None
            if readback is not None:
                readback.record(enc, lend=staging, objects=objects)
            ts_buf = resolve_timestamps(self.device, enc, qs, len(seg)) if qs is not None else None
            done = enc.finish()
            self.submit_at = time.perf_counter()
            self.device.queue.submit([done])
            if seg and seg[-1].stage.name in patch:
                self.apply_patch(seg[-1], patch[seg[-1].stage.name])
            if readback is not None:
                got = readback.read(keep_staging=True)
                if readback.owns_staging:  # a bigger one than the last: lend it on
                    if staging is not None:
                        staging.destroy()
                    staging = readback.staging
                caps.update(got[0])
                held.update(got[1])
                held_heads.update(got[2])
            if ts_buf is not None:
                ticks = np.frombuffer(self.device.queue.read_buffer(ts_buf), dtype=np.uint64).reshape(-1, 2)
                stage_ms.update(zip((p.stage.name for p in seg), stage_times_ms(ticks)))
            if seg and seg[-1].chunks:  # the unembedding of a streamed pass, chunk after chunk
                name, got = seg[-1].stage.name, read_chunks(self.device, seg[-1], cut[0], staging, timed)
                caps[name], staging = got.array, got.staging
                held.update({name: got.positions} if got.positions is not None else {})
                stage_ms.update({name: got.gpu_ms} if timed else {})
        self._staging = staging  # its pages stay warm: fresh ones cost lavapipe 0.3 s per 128 MiB of logits
        return Submitted(caps, held, held_heads, stage_ms)

    def submit_step(self, step: CompiledStep, request: PassRequest) -> Submitted:
        """A compiled decode step (labkit.gpu.compiled_step): its one encoder, taken from the step
        before it when that recorded it ahead, submitted; then, while the GPU runs it, the next
        step's moving words written and its encoder recorded (`CompiledStep.ahead`), and only then
        the captures read back. So a warm step's host time up to its submit is its token's row."""
        n, cut, captured = step.kv.n_past, (request.positions, request.heads), step.captured
        ahead = step.take_ahead(n, self._staging)
        if ahead is None:
            step.set_workgroups(n)
            done, readback = self._record_step(step, step.commands, captured, request.T, cut, self._staging)
        else:
            done, readback = ahead.buffer, ahead.readback
        self.submit_at = time.perf_counter()
        self.device.queue.submit([done])
        if ahead is not None:
            step.set_workgroups(n)  # the plans show the counts the step ran with
        staging = readback.staging if readback is not None else self._staging
        commands = step.commands_at(n + 1) if self.record_ahead and step.runs_at(n + 1) else None
        if commands is not None and (readback is None or len(readback.sizes) == 1):
            step.write_values(n + 1)
            buffer, rb = self._record_step(step, commands, captured, request.T, cut, staging)
            step.ahead = Ahead(n + 1, buffer, rb, staging)
        if readback is None:
            return Submitted({}, {}, {}, {})
        caps, held, heads = readback.read(keep_staging=True)
        if readback.owns_staging:  # a bigger one than the last: kept from now on
            if self._staging is not None:
                self._staging.destroy()
            self._staging = readback.staging
        return Submitted(caps, held, heads, {})

    def _record_step(self, step: CompiledStep, commands: list[list] | None, captured: list[StagePlan], T: int,
                     cut: tuple, staging):  # fmt: skip
        """A compiled step's dispatches (as `commands`, else its plans' dispatches) and the copies of its
        captures in one finished encoder, and their Readback (None when nothing is captured): through
        `staging` when it is big enough."""
        enc = self.device.create_command_encoder()
        if commands is not None:
            encode(enc, [], commands=commands)
        else:
            encode(enc, [d for p in step.plans for d in p.dispatches])
        readback = Readback(self.device, captured, T, *cut) if captured else None
        if readback is not None:
            readback.record(enc, lend=staging)
        return enc.finish(), readback

    def apply_patch(self, p: StagePlan, fn: Patch) -> None:
        """Read a stage's output, let `fn` change it, write it back where the next stages read it."""
        cur = read_now(self.device, [p], p.out.shape[0])[p.stage.name]
        new = np.asarray(fn(cur.copy(), p.stage.name), dtype=np.float32)
        if new.shape != cur.shape:
            raise ValueError(f"patch for {p.stage.name} returned shape {new.shape}, expected {cur.shape}")
        self.device.queue.write_buffer(p.out.buffer, 4 * p.out.offset, np.ascontiguousarray(new).tobytes())


def _record(enc, seg: list[StagePlan], qs) -> None:
    """A segment's dispatches into `enc`: one compute pass, or with per-stage timestamps (`qs`) one
    pass per stage."""
    if qs is None:  # no per-stage timestamps: every dispatch of the segment in one compute pass
        encode(enc, [d for p in seg for d in p.dispatches])
    else:
        for j, p in enumerate(seg):
            record_stage(enc, p, qs, j)


def segments_of(todo: list[StagePlan], cut_after: set[str], stepped: bool) -> list[list[StagePlan]]:
    """Split the stages into submits: after every stage when stepped, else after each patched stage
    and at each segment end of a streamed pass."""
    segs, cur = [], []
    for p in todo:
        cur.append(p)
        if stepped or p.stage.name in cut_after or p.segment_end:
            segs.append(cur)
            cur = []
    if cur or not segs:
        segs.append(cur)
    return segs


def record_stage(enc, plan: StagePlan, query_set=None, index: int = 0) -> None:
    """One stage's dispatches in a compute pass of their own (timed when a query set is given)."""
    encode(enc, plan.dispatches, timestamp_writes=pass_timestamps(query_set, index))


def stage_times_ms(ticks: np.ndarray) -> list[float]:
    """Each stage's GPU ms from its pass's (begin, end) timestamps, in submission order: from the
    end of the stage before it to its own end (the first stage: its own begin to end). lavapipe
    writes a small dispatch's begin timestamp after the dispatch has run, so its own window reads
    ~0 and its time shows as a gap before it: a 1B-shaped prefill of 512 tokens charged each
    softmax 0.06 ms of its 84 and each SwiGLU 0.07 of its 19 (2.7 s of 25.6 in such gaps)."""
    t = ticks.astype(np.int64)
    if not len(t):
        return []
    ends = t[:, 1]
    return [float(ends[0] - t[0, 0]) / 1e6] + [float(e) / 1e6 for e in np.diff(ends)]


def clear_regions(device, plans: list[StagePlan]) -> None:
    """Zero the output buffers of a pass built through a plan cache, as WebGPU zero-fills a new buffer:
    an unwritten row (a faulty variant's) reads 0.0 whatever ran before, so a run of a lab equals the
    same run of a fresh one. The KV cache and the states are left alone: they hold what came before the pass."""
    enc = device.create_command_encoder()
    kept = [p for p in plans if not p.skipped and not p.stage.kv_write and p.out.layout != "state"]
    for buf in {id(p.out.buffer): p.out.buffer for p in kept}.values():
        enc.clear_buffer(buf)
    device.queue.submit([enc.finish()])


def poison_region(device, r: Region) -> None:
    device.queue.write_buffer(r.buffer, 4 * r.offset, np.full(r.size, POISON_BITS, dtype=np.uint32).tobytes())
