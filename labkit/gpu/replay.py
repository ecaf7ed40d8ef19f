"""Step replay: a decode step's stage plans, kept and reused verbatim by the next step.

Two decode steps differ only where a stage reads the step's position or token: the embedding
(the new token's row), rope (its position), the attention stages (one key more) and the stages
that write the KV cache (at n_past). Every other stage of step k+1 would be planned exactly as in
step k: the same pipeline, the same bind group over the same regions, the same uniform bytes.
Planning it again cost half of a SmolLM2 step's 16 ms of Python, so a `StepReplay` keeps each
stage's plan and hands it back unchanged when

- its op does not read the pass position (`Op.per_step` is False) and it writes no KV cache,
- its kernel, policy and skip (the stage signature) are the ones it was planned with,
- the regions it reads are the ones it was planned over (a region that moved, because an
  attention map outgrew its buffer, makes its readers plan again), the other input of a stage
  fused into its kernel among them (the residual stream a matmul's epilogue adds), and so is its
  fusion with the next stage (labkit.gpu.fusion: a variant selected for that stage ends it).

Under the kernel selection and pass key of the last step, a stage's signature and fusion are the
ones it was planned with, so a stage that moves no step is handed back without its inputs compared,
unless a region it reads changed this pass (`unchanged`). A look-ahead over a placeholder token
(labkit.gpu.lookahead) keeps the embedding's plan too, as its real token's is made when the step
is taken. A Llama-3.2-1B step's look-ahead planning, under a GPU's kernels (AMD EPYC host, one
process, alternating, gc off): 8.43 ms comparing every stage's inputs, 7.75 without, 6.58 with
the embedding kept as well.

A pass after a whole one under the same selection and key goes further: it takes the kept step
whole, with its regions, and plans only the stages the last pass could not hand back (`moving`:
the embedding, and those that read the position, write the KV cache or read a grown attention
map, as below: 80 of a Llama-3.2-1B step's 275), instead of each stage asking
`unchanged` in turn. If one of them writes a region a stage handed back reads, the pass goes on
stage by stage from there. That step's look-ahead planning: 0.90-0.92x (same host, blocks of
steps alternated in one process).

A stage that reads the position (rope, attention, the KV writers) or an attention map one key
longer (softmax) is moved to the step's position by labkit.gpu.step_refresh when it can be: its
kept dispatches, with its op's new uniforms and workgroup counts.

Everything else is planned afresh, each stage with its own `PlanCache`, so re-planning one stage
never moves another stage's objects: the k-th request of a stage gets the object its k-th request
got last step, and only uniforms whose bytes changed are rewritten (all of them in one write: the
stages' uniforms are slots of one `UniformArena`). A warm step therefore creates no
GPU objects and records one command encoder over kept dispatches. Tests check that replayed decode
equals decode planned afresh each step, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from labkit.gpu.plan_cache import PlanCache, UniformArena
from labkit.ops import OPS


class StepReplay:
    def __init__(self, device: Any, round_limit: int = 0, n_stages: int = 1024):
        self.device, self.round_limit = device, int(round_limit)
        self.shared = PlanCache(device, round_limit)  # the pass's own objects: the readback's staging buffer
        # every stage's uniforms, written once per step (flush): room for two a stage (a matmul has
        # one per weight window); past that, a stage's uniforms are buffers of their own
        self.arena = UniformArena(device, capacity=max(64, 2 * n_stages) * UniformArena.ALIGN)
        self._caches: dict[str, PlanCache] = {}  # stage name -> the objects of its last planning
        self._plans: dict[int, Any] = {}  # stage index -> its StagePlan, as last step planned or replayed it
        self._inputs: dict[int, tuple] = {}  # stage index -> the regions that plan reads
        self._key: tuple = ()
        self.ahead = None  # the next step, planned while the GPU runs this one (labkit.gpu.lookahead)
        self.ahead_taken = 0  # steps that took the plans made ahead for them (tests, profiling)
        self.ahead_s = 0.0  # how long the last look-ahead planned
        self.replanned: list[str] = []  # stages the last step planned afresh (tests, profiling)
        self.refreshed: list[str] = []  # stages the last step moved to its position (labkit.gpu.step_refresh)
        self._selection: Any = None  # the kernel selection the kept plans were made under
        self._graph: list | None = None  # the graph `_steady` describes
        self._epilogues: list | None = None  # and the fusions it describes (labkit.gpu.planner._epilogues)
        self._steady: list[frozenset | None] = []  # per stage: what its plan reads, or None if it moves each step
        self._asked: list[int] = []  # the stages this pass planned, moved or compared (not handed back)
        self._moving: tuple[int, ...] = ()  # the stages the last pass asked for: those the next plans
        self._unsafe: tuple[tuple, frozenset] = ((), frozenset())  # (a moving set, what the others read)
        self._ids_readers: set[int] = set()  # the stages whose kept plan reads the token ids (the embedding)
        self._regions: tuple[dict, dict] = ({}, {})  # the last pass's regions and fused regions, by stage name
        self._changed: set[str] = set()  # regions this pass that differ from the kept plans' (see `begin`)
        self._trusted = False  # this pass may hand back kept plans without comparing their inputs
        self._complete = False  # the last pass was planned to its end (`end`): its plans agree with each other
        self.placeholder_ids = False  # this pass is a look-ahead over a placeholder token (see `unchanged`)
        self.handed_back = 0  # plans the last pass handed back unplanned, one by one or at once (tests, profiling)
        self.at_once = False  # the last pass started from the kept step whole (`take_kept_step`; tests, profiling)

    @contextmanager
    def active(self, key: tuple) -> Iterator[StepReplay]:
        """Build one step. `key`: what every stage plan depends on besides its own inputs (token
        count, last-logits-only); a change drops the kept plans."""
        if key != self._key:
            self._plans, self._inputs, self._key, self.ahead = {}, {}, key, None
            self._ids_readers = set()
        self.replanned, self.refreshed = [], []
        with self.shared.active():
            yield self

    def begin(self, graph: list, selection: Any, epilogues: list) -> None:
        """Start planning a pass under `selection`, whose stages fuse `epilogues` (per stage, the next
        stage fused into its kernel, or None: labkit.gpu.fusion). A stage that moves no step (not
        per-step, no KV write) and reads no region this pass changed keeps its plan without its
        inputs being compared (`unchanged`): under the same selection and pass key its signature
        and fusion are the ones it was planned with, so that comparison could only find them equal.
        What a stage reads: its inputs, its own region (an earlier kernel may write it), and the
        other input of a stage fused into it (the residual stream its kernel adds). Stages planned
        or moved again record the regions they changed (`_note`)."""
        if graph is not self._graph or epilogues is not self._epilogues:
            self._graph, self._epilogues, self._steady = (
                graph,
                epilogues,
                [_reads(st, ep) for st, ep in zip(graph, epilogues)],
            )
            self._moving, self._unsafe = (), ((), frozenset())  # learned over other reads: learn again
            self._complete = False  # so this pass asks every stage, as the first of a new graph does
        self._trusted = selection is self._selection and self._complete
        self._complete = False
        self._selection, self._changed, self.handed_back, self.at_once = selection, set(), 0, False
        self._asked = []

    def unchanged(self, i: int) -> Any:
        """Stage i's kept plan when nothing it reads changed since it was made (see `begin`), else None.
        A plan over the pass's tokens (the embedding) is made again, but a look-ahead over a
        placeholder token keeps it: labkit.gpu.lookahead.take plans it for the real token."""
        plan = self._plans.get(i) if self._trusted else None
        if plan is not None:
            if plan.reads_ids and self.placeholder_ids:
                return self._handed(plan)
            reads = self._steady[i]
            if not plan.reads_ids and reads is not None and reads.isdisjoint(self._changed):
                return self._handed(plan)
        self._asked.append(i)
        return None

    def moving(self) -> list[int] | None:
        """The stages this pass plans when every other one is handed back at once: a trusted pass (see
        `begin`) after a whole one. They are the stages the last pass could not hand back (those that
        read the position or the token, write the KV cache, or read an attention map that grew), and
        the embedding when this pass is not a look-ahead over a placeholder token (in one, `unchanged`
        still hands the embedding back). None otherwise: then each stage asks `unchanged` in turn."""
        if not self._trusted or self._changed or len(self._plans) != len(self._graph):
            return None
        moving = self._moving
        if not self.placeholder_ids and not self._ids_readers.issubset(moving):
            moving = tuple(sorted({*moving, *self._ids_readers}))
        if self._unsafe[0] != moving:  # what the stages handed back at once read
            inside = set(moving)
            read = (r for i, r in enumerate(self._steady) if i not in inside and r is not None)
            self._unsafe = (moving, frozenset().union(*read))
        return list(moving)

    def changed_under_kept(self) -> bool:
        """A stage of `moving` wrote a region that a stage handed back at once reads: that stage must be
        planned after all, so the pass goes on stage by stage."""
        return not self._changed.isdisjoint(self._unsafe[1])

    def take_kept_step(self) -> tuple[list, dict, dict]:
        """Start this pass from the kept step whole (`at_once`): every kept plan, in stage order, with
        the last pass's regions and fused regions by stage name (the pass copies them into its own)."""
        regions, fused = self._regions
        self.at_once = True
        return [self._plans[i] for i in range(len(self._graph))], regions, fused

    def kept_regions(self) -> tuple[dict, dict]:
        """The last whole pass's regions and fused regions, by stage name (not to be changed)."""
        return self._regions

    def end(self, regions: dict, fused: dict) -> None:
        """The pass is planned: keep its regions and the stages it asked for
        (`moving`) for the next, write its uniforms."""
        self._regions, self._complete, self._moving = (regions, fused), True, tuple(self._asked)
        self.flush()

    def distrust(self) -> None:
        """The kept plans no longer agree with each other (a stage's region moved after its readers were
        planned): the next pass compares every stage's inputs."""
        self._complete = False

    def _handed(self, plan: Any) -> Any:
        self.handed_back += 1
        return plan

    def _note(self, old: Any, new: Any) -> None:
        """The regions stage plan `new` writes that differ from its kept plan `old`'s."""
        if old is None or old.out != new.out:
            self._changed.add(new.stage.name)
        if old is None or old.also_writes != new.also_writes:
            self._changed.update(new.also_writes, () if old is None else old.also_writes)

    def kept(self, i: int, st: Any, signature: tuple, inputs: tuple) -> Any:
        """Stage i's kept plan when nothing it depends on changed, else None."""
        if i in self._plans and self._replayable(i, st, signature, inputs):
            return self._plans[i]
        return None

    def moved(self, i: int, st: Any, signature: tuple, inputs: tuple, refresh: Callable[[Any], Any]) -> Any:
        """Stage i's kept plan moved to this step by `refresh(plan)` (labkit.gpu.step_refresh), when it
        was planned with the same kernel, policy, skip and fusion; None when it must be planned afresh."""
        old = self._plans.get(i)  # inputs[-2:]: its fused region and epilogue (labkit.gpu.planner)
        if old is None or old.signature != signature or self._inputs[i][-2:] != inputs[-2:]:
            return None
        plan = refresh(old)
        if plan is not None:
            self._note(old, plan)
            self._plans[i], self._inputs[i] = plan, inputs
            self.refreshed.append(st.name)
        return plan

    def stage(self, i: int, st: Any, signature: tuple, inputs: tuple, make: Callable[[], Any]) -> Any:
        """Stage i planned afresh (`make()`) with the stage's own plan cache active, and kept for the
        next step; the planner asks `kept` first."""
        cache = self._caches.get(st.name) or self._caches.setdefault(
            st.name, PlanCache(self.device, self.round_limit, self.arena)
        )
        try:
            with cache.active():
                plan = make()
        except BaseException:
            # its cache has rewritten (or freed) uniforms the kept plan binds: never hand that plan back
            self._plans.pop(i, None)
            self._inputs.pop(i, None)
            self._complete = False
            raise
        self.replanned.append(st.name)
        (self._ids_readers.add if plan.reads_ids else self._ids_readers.discard)(i)
        self._note(self._plans.get(i), plan)
        self._plans[i], self._inputs[i] = plan, inputs
        return plan

    @property
    def key(self) -> tuple:
        """The pass key of the steps being built (see `active`)."""
        return self._key

    def flush(self) -> None:
        """Write the step's changed uniforms: once it is planned, before it is submitted."""
        self.arena.flush()

    def _replayable(self, i: int, st: Any, signature: tuple, inputs: tuple) -> bool:
        old = self._plans[i]
        return not st.kv_write and not OPS[st.op].per_step and old.signature == signature and self._inputs[i] == inputs

    @property
    def created(self) -> int:
        """GPU objects created through this replay's caches (tests: a warm step creates none)."""
        return self.shared.created + sum(c.created for c in self._caches.values())


def _reads(st: Any, epilogue: Any) -> frozenset | None:
    """The regions a stage's plan is bound to (its inputs, its own, a fused stage's other input), or
    None for a stage that moves each step (reads the position or the token, writes the KV cache)."""
    if st.kv_write or OPS[st.op].per_step:
        return None
    return frozenset((*st.inputs, st.name, *((epilogue.other,) if epilogue is not None else ())))
