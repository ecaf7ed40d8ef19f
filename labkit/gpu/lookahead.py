"""Look-ahead planning: the next decode step planned while the GPU runs this one.

A decode step's Python planning (about 6 ms for a Llama-3.2-1B step on a 2-core Xeon) and the
GPU's work for it used to follow each other: the host planned, submitted, waited. The next step's
position is known once this one is submitted; only its token is not. So while the GPU runs step
k, `plan_ahead` plans step k+1 with a placeholder token (the current one), through the same step
replay (labkit.gpu.replay) the step would use anyway. When step k+1 comes with its real token,
`take` hands those plans back with only the stages that read the token ids planned again (the
embedding: labkit.gpu.planner.replan_for_ids). So the look-ahead does not plan those for the
placeholder: they keep this step's plans (StepReplay.placeholder_ids), whose regions the real ones
must match. On a real GPU the planning then overlaps the GPU's work. On lavapipe it takes the cores
the step runs on (10% slower), so generate plans ahead only on a real GPU (GpuExecutor.plans_ahead).

Writes the look-ahead makes (uniforms) go through the queue, so they land after step k's work; the
plans it makes are used only by a step of the same pass key, position and kernel selection, else
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.gpu.kv_cache import GpuKVCache
from labkit.gpu.pass_plan import StagePlan
from labkit.gpu.planner import plans_under, replan_for_ids
from labkit.gpu.reuse import Reuse


@dataclass
class Lookahead:
    key: tuple  # the pass key the step was planned under (labkit.gpu.reuse.Reuse.scope)
    cache: GpuKVCache  # the KV cache it reads and writes (a new generate brings a new one)
    n_past: int  # the cache position it was planned for
    selection: Any  # the kernel selection it was planned with (the executor's object)
    plans: list[StagePlan]
    regions: tuple[dict, dict]  # the plans' regions and fused regions by stage name (StepReplay.kept_regions)


def plan_ahead(ex: Any, ids: list[int], cache: GpuKVCache, last_only: bool, key: tuple) -> Lookahead | None:
    """The step after this one-token step, planned now with this step's token in its place; None
    for a pass of more than one token, or when the cache has no room for the next."""
    if len(ids) != 1 or cache.n_past + 2 > cache.capacity:
        return None
    cache.advance(1)
    replay = ex.step_replay()
    replay.placeholder_ids = True  # the embedding keeps its plan: take() makes it for the real token
    try:
        plans, _ = plans_under(ex, ids, cache, last_only, Reuse.steps(), None, None)
    finally:
        cache.rewind(1)
        replay.placeholder_ids = False
    return Lookahead(key, cache, cache.n_past + 1, ex.selection(), plans, replay.kept_regions())


def take(ahead: Lookahead | None, ex: Any, ids: list[int], cache: GpuKVCache, last_only: bool, key: tuple):
    """The plans of this step from a look-ahead made for it, finished for its token; None when
    there is none, or it was made for another step."""
    if ahead is None or ahead.key != key or ahead.cache is not cache or ahead.n_past != cache.n_past:
        return None
    if ahead.selection is not ex.selection():  # a variant switched since
        return None
    plans = replan_for_ids(ex, ahead.plans, ahead.regions, ids, cache, last_only, ex.step_replay())
    ex.step_replay().ahead_taken += plans is not None
    return plans
