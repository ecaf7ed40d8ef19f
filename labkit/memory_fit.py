"""Fitting each pass into a lab's memory budget, before anything is allocated (labkit.model.memory
makes the plan; this decides with it).

Per pass it: plans both engines' parts (what the other engine already holds counts too); keeps GPU
weights as GGUF bytes when the repacked layout would not fit; cuts the default capture of every
stage to what fits, and says once what it left out; raises MemoryBudgetError for a capture asked
for by name that does not fit; and bounds the reference's weight cache by the room left (a GPU
pass evicts held weights, least recently used first).
"""

from __future__ import annotations

import warnings
from typing import Any

from labkit.errors import MemoryBudgetWarning
from labkit.model.memory import MemoryPart, MemoryPlan, capture_fallbacks, gb, reference_parts, resident_bytes

# the GPU weights' layouts, widest first: what `MemoryFit.weights` narrows through
WEIGHT_TIERS = ("repacked", "blocks", "gguf")
# the share of the budget the reference's weight cache never takes: the cache fills the room the
# other parts leave, so what no part counts (the allocator's slack, numpy's temporaries, the GPU
# runtime's growth) would otherwise go over it. An 8B compare under memory="10GB" went 1.2% over
# with no share kept.
UNPLANNED_SHARE = 32
TIER_WORDS = {
    "blocks": "in their formats' blocks layouts, near their GGUF width",
    "gguf": "as GGUF bytes, read by the raw-bytes kernels",
}


class MemoryFit:
    """The budget policy of one lab (`lab.fit`)."""

    def __init__(self, lab: Any):
        self.lab = lab
        self.said: set[tuple[str, str]] = set()  # capture cuts already reported (said once per lab)

    def plan(self, T: int, names, last_only: bool = False, engines=("gpu", "reference")) -> MemoryPlan:
        """The plan of a pass on `engines`; what the other engine already holds counts too (both
        engines share the budget), and the reference's weight cache gets the room that is left."""
        from labkit.model.weight_cache import dtype_for

        parts: list[MemoryPart] = []
        if self.lab.budget.baseline:
            parts.append(MemoryPart("process", "baseline", self.baseline(), "resident, besides the parts below"))
        if "gpu" in engines or "executor" in vars(self.lab):
            from labkit.gpu.memory_plan import gpu_parts

            gpu = gpu_parts(self.lab.executor, T, names, last_only)
            parts += gpu if "gpu" in engines else gpu[:1]  # the weights stay on the device
        room = None
        if "reference" in engines:
            lab, cfg = self.lab, self.lab.config

            def reference(itemsize: int, room: int) -> list[MemoryPart]:
                return reference_parts(lab.gguf, lab.graph, cfg, T, names, itemsize, room)

            fixed = reference(8, 0)[1:]  # all but the weight cache, which takes the room left
            room = max(self.plannable() - sum(p.nbytes for p in parts + fixed), 0)
            parts += reference(dtype_for(lab.gguf, room).itemsize, room)
        elif "reference_engine" in vars(self.lab):  # held weights yield to the pass, least recently used first
            room = max(self.plannable() - sum(p.nbytes for p in parts), 0)
            held = self.lab.reference_engine.weights.nbytes
            parts.append(MemoryPart("reference", "weight cache", min(held, room), "held; yields to the pass"))
        return MemoryPlan(self.lab.budget, T, tuple(parts), room)

    def plannable(self) -> int:
        """The budget less its share that no part may take (UNPLANNED_SHARE)."""
        return self.lab.budget.nbytes - self.lab.budget.nbytes // UNPLANNED_SHARE

    def baseline(self) -> int:
        """What the process holds besides this plan's parts: resident now, less the weights both
        engines hold (they are parts of their own), and never less than when the lab opened. So the
        GPU runtime, earlier runs' captures and other labs count against a memory= budget."""
        lab = self.lab
        held = lab.reference_engine.weights.nbytes if "reference_engine" in vars(lab) else 0
        held += lab.executor.gpu_bytes() if "executor" in vars(lab) else 0
        return max(lab.budget.baseline, resident_bytes() - held)

    def make_room(self, plan: MemoryPlan, engine: str) -> None:
        """Bound the reference's weight cache by the plan's room for it: its own pass's room, or what a
        GPU pass leaves (held weights are evicted, least recently used first)."""
        if plan.room is None or (engine != "reference" and "reference_engine" not in vars(self.lab)):
            return
        cache = self.lab.reference_engine.weights
        if engine == "reference":
            cache.set_capacity(plan.room)
        else:
            cache.shrink_to(plan.room)

    def weights(self, T: int, last_only: bool) -> None:
        """GPU weights narrower when the current layout would not fit the budget with the smallest
        capture, a tier at a time (WEIGHT_TIERS): from the repacked layouts (int8, Q6_K's padded
        blocks) to each format's blocks layout where it has one (near its GGUF width; slower than
        int8 on lavapipe for the legacy formats), then to GGUF bytes for every weight (the raw-bytes
        kernels: slower still). Said once per narrowing; a layout never widens again."""
        ex = self.lab.executor
        now = WEIGHT_TIERS.index(ex.weight_layout)
        if now == len(WEIGHT_TIERS) - 1 or self.plan(T, ["logits"], last_only, engines=("gpu",)).fits:
            return
        for layout in WEIGHT_TIERS[now + 1 :]:
            ex.weight_layout = layout
            if self.plan(T, ["logits"], last_only, engines=("gpu",)).fits:
                warnings.warn(
                    f"labkit: the GPU weights do not fit the memory budget of {gb(self.lab.budget.nbytes)} as they "
                    f"are; they stay {TIER_WORDS[layout]} (slower on lavapipe). A larger memory= budget gives the "
                    "repacked layout.",
                    MemoryBudgetWarning, stacklevel=4,
                )  # fmt: skip
                return
        ex.weight_layout = WEIGHT_TIERS[now]  # none fits: the plan's error names the parts

    def capture(self, engine: str, T: int, names, last_only: bool = False) -> list[str] | None:
        """The capture a pass can hold: the one asked for (MemoryBudgetError if it does not fit), or,
        for the default capture of every stage, the most of it that fits, said once."""
        if engine == "gpu":
            self.weights(T, last_only)
        plan = self.plan(T, names, last_only, engines=(engine,))
        if plan.fits or names is not None:
            plan.check(f"a {engine} pass of {T} tokens")
            self.make_room(plan, engine)
            return names
        for desc, smaller in capture_fallbacks(self.lab.graph):
            if (cut := self.plan(T, smaller, last_only, engines=(engine,))).fits:
                self.make_room(cut, engine)
                if (engine, desc) not in self.said:
                    self.said.add((engine, desc))
                    warnings.warn(
                        f"labkit: capturing every stage of a {T}-token {engine} pass needs {gb(plan.total())}, over "
                        f"the memory budget of {gb(self.lab.budget.nbytes)}; captured {desc} instead. Get the rest in "
                        'parts: names=["blk.*.attn_scores"], layers=[...], positions="last" (see lab.memory()).',
                        MemoryBudgetWarning, stacklevel=3,
                    )  # fmt: skip
                return smaller
        plan.check(f"a {engine} pass of {T} tokens")
        return names
