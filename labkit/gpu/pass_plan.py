"""What planning a pass produces: where each stage's output lives (`Region`) and what runs it
(`StagePlan`). The planner (labkit.gpu.executor) makes them; the submitter, the readback, the
plan cache and the stepper read them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import wgpu

from labkit.gpu.chunked_logits import LogitsChunk
from labkit.gpu.dispatch import Dispatch
from labkit.model.graph import Stage


@dataclass
class Region:
    """Where a stage's output lives: a buffer, a float offset, and the capture shape."""

    buffer: wgpu.GPUBuffer
    offset: int  # in floats
    shape: tuple[int, ...]
    layout: str = "rows"  # "rows": [positions, ...]; "heads": an attention map [heads, queries, keys]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class StagePlan:
    stage: Stage
    out: Region
    dispatches: list[Dispatch]
    signature: tuple = ()  # kernel, policy and skip that produced it; a re-run starts where this changes
    skipped: bool = False  # nothing reads it under the selected kernels: not computed in this pass
    segment_end: bool = False  # a streamed pass submits and reads its captures back after this stage
    also_writes: dict[str, Region] = field(default_factory=dict)  # later stages its kernel writes (fusion)
    chunks: list[LogitsChunk] = field(default_factory=list)  # run and read back one by one (chunked_logits)
    reads_ids: bool = False  # its plan read the token ids (the embedding): a compiled step writes its rows
    parts: list[Region] = field(default_factory=list)  # a batch's per-sequence outputs (labkit.gpu.batch_plan)
