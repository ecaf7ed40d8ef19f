"""What a pass takes over from earlier passes: one policy, named by its caller, bounded here.

Planning a pass afresh costs Python and driver calls (buffers, uniforms, bind groups), and
fresh pages cost lavapipe time, so a pass reuses what earlier ones built, in one of three ways:

- `rerun`: a kept pass of the same ids on the same KV cache (lab.run after `use()`). Stages
  before the first one whose kernel, policy or skip changed keep their regions and data and are
  not dispatched again; the cache is rewound to before those ids.
- `objects`: the GPU objects of a role's last pass (labkit.gpu.plan_cache): the k-th buffer
  request gets the k-th buffer of last time. For short runs and generate's prefill.
- `steps`: generate's decode steps run one compiled step (labkit.gpu.compiled_step), compiled again when
  it no longer holds; a step that cannot be compiled is planned over the `decode` role's objects.

`FRESH` plans and allocates everything. A caller names what it wants (`Reuse.rerun(previous)`,
`Reuse.objects("run")`, `Reuse.steps()`); `Reuse.within` cuts that down to what the pass can take,
in this one place:

- a stepped pass, or a debug or patched one asking for a rerun or steps, is planned fresh: a
  rerun would skip the very stages it must poison or patch, and a compiled step is a plain
  decode step's;
- a rerun needs a previous pass whose every stage had its own region (`PassResult.reusable`);
- objects are kept for passes below scratch.STREAM_MIN_TOKENS: a streamed pass frees its scratch instead
  of holding it until the next pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from labkit.gpu import scratch
from labkit.gpu.allocator import Allocator, FreshObjects

ReuseKind = Literal["fresh", "rerun", "objects", "steps"]


@dataclass(frozen=True)
class Reuse:
    kind: ReuseKind = "fresh"
    previous: Any = None  # rerun: the PassResult of the same ids on the same cache
    role: str = ""  # objects: whose plan cache ("run", "prefill")

    @staticmethod
    def rerun(previous: Any) -> Reuse:
        return Reuse("rerun", previous=previous)

    @staticmethod
    def objects(role: str) -> Reuse:
        return Reuse("objects", role=role)

    @staticmethod
    def steps() -> Reuse:
        return Reuse("steps")

    def within(self, T: int, debug: bool, patched: bool, stepped: bool) -> Reuse:
        """This reuse, or what of it a pass of T tokens with these settings can take."""
        if stepped:
            return FRESH
        if self.kind == "rerun" and (debug or patched or not self.previous.reusable):
            return FRESH
        if self.kind == "steps" and (debug or patched):
            return FRESH
        if self.kind == "objects" and T >= scratch.STREAM_MIN_TOKENS:
            return FRESH
        return self

    def allocator(self, executor: Any) -> Allocator:
        """Where the pass's GPU objects come from (labkit.gpu.allocator): the role's plan cache (for
        steps: the decode role's, which a step the compiled step cannot take is planned over), or
        new ones, with operand textures recycled between its stages."""
        if self.kind == "objects":
            return executor.plan_cache(self.role)
        if self.kind == "steps":
            return executor.plan_cache("decode")
        return FreshObjects(executor.gpu)


FRESH = Reuse()
