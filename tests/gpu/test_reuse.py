"""The one reuse policy (labkit.gpu.reuse): what a pass takes over from earlier ones, cut down in
one place, and lab.run's same-prompt re-run under every setting that must not take it."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.gpu import scratch
from labkit.gpu.reuse import FRESH, Reuse

IDS = [1, 5, 9, 7, 3, 2, 11, 4, 8]


class _Previous:
    def __init__(self, reusable: bool):
        self.reusable = reusable


@pytest.mark.parametrize(
    "wanted, T, debug, patched, stepped, kind",
    [
        (Reuse.objects("run"), 8, False, False, False, "objects"),
        (Reuse.objects("run"), 8, True, False, False, "objects"),  # poisoned regions are written over anyway
        (Reuse.objects("run"), 8, False, False, True, "fresh"),
        (Reuse.objects("run"), scratch.STREAM_MIN_TOKENS, False, False, False, "fresh"),
        (Reuse.steps(), 1, False, False, False, "steps"),
        (Reuse.steps(), 1, False, True, False, "fresh"),
        (Reuse.steps(), 1, True, False, False, "fresh"),
        (Reuse.rerun(_Previous(True)), 8, False, False, False, "rerun"),
        (Reuse.rerun(_Previous(True)), 8, True, False, False, "fresh"),
        (Reuse.rerun(_Previous(True)), 8, False, True, False, "fresh"),
        (Reuse.rerun(_Previous(True)), 8, False, False, True, "fresh"),
        (Reuse.rerun(_Previous(False)), 8, False, False, False, "fresh"),
        (FRESH, 8, False, False, False, "fresh"),
    ],
)
def test_a_pass_takes_only_the_reuse_it_can(wanted, T, debug, patched, stepped, kind):
    assert wanted.within(T, debug, patched, stepped).kind == kind


def test_same_prompt_rerun_then_debug_patch_and_stepped_passes_match_a_fresh_lab(tiny_model):
    """After a run of IDS, a debug, a patched and a stepped run of the same IDS take no rerun: the
    KV cache is rewound, every stage is recomputed, and each equals the same run on a fresh lab."""
    path = tiny_model("llama", "Q4_K")
    lab = labkit.open(path)
    first = lab.run(IDS)
    again = lab.run(IDS)
    assert again.timings["recomputed_from"] == "embed"  # a rerun with no switch recomputes it all
    dbg = lab.run(IDS, debug=True)
    assert dbg.timings["recomputed_from"] == "embed" and not any(dbg.unwritten.values()), dbg.unwritten
    stepped = lab.run(IDS, stepped=True)
    double = {"blk.0.attn_norm": lambda a, name: 2 * a}
    patched = lab.run(IDS, patch=double)
    fresh = labkit.open(path)
    for name in first.captures:
        for run in (again, dbg, stepped):
            assert run[name].tobytes() == first[name].tobytes(), name
    want = fresh.run(IDS, patch=double)
    diff = np.abs(patched["logits"] - want["logits"]).max()
    assert patched["logits"].tobytes() == want["logits"].tobytes(), f"max diff {diff}"
    assert patched["logits"].tobytes() != first["logits"].tobytes()


def test_a_failed_pass_of_the_kept_prompt_leaves_nothing_to_rerun(tiny_model):
    """A patched pass of the kept prompt that fails (its patch raises) must not leave the kept pass
    behind on a rewound cache: the next run of the prompt plans afresh and equals the first."""
    lab = labkit.open(tiny_model("llama", "Q4_K"))
    first = lab.run(IDS)

    def broken(a, name):
        raise RuntimeError("a student's patch")

    with pytest.raises(RuntimeError, match="student"):
        lab.run(IDS, patch={"blk.0.attn_norm": broken})
    again = lab.run(IDS)
    assert again["logits"].tobytes() == first["logits"].tobytes()


def test_a_full_uniform_arena_falls_back_to_buffers_of_their_own():
    """A step's uniforms are slots of one arena (one write per step); when it is full, the uniforms
    past it are buffers of their own, each at its own index, kept from pass to pass, while the
    ones that have slots keep them."""
    from labkit.gpu.device import get_device
    from labkit.gpu.plan_cache import PlanCache, UniformArena

    gpu = get_device()
    arena = UniformArena(gpu.device, capacity=2 * UniformArena.ALIGN)  # room for two slots
    cache = PlanCache(gpu, arena=arena)

    def one_pass(v: int) -> list:
        with cache.one_pass():
            return [cache.uniform(bytes([v + i]) * 16) for i in range(4)]

    first = one_pass(1)
    assert [isinstance(u, tuple) for u in first] == [True, True, False, False]
    assert (
        arena.host[:16] == bytes([1]) * 16
        and arena.host[UniformArena.ALIGN : UniformArena.ALIGN + 16] == bytes([2]) * 16
    )
    second = one_pass(2)  # the same slots and the same buffers, rewritten
    assert second == first and arena.host[:16] == bytes([2]) * 16
    created = cache.created
    assert one_pass(3) == second and cache.created == created  # nothing new from then on
    assert len({id(u) if not isinstance(u, tuple) else u for u in second}) == 4 and cache.n_objects == 2


def test_uniform_arena_slots_a_cache_gives_up_are_taken_again():
    """A long-lived lab switches kernels: a stage's uniform that changes size, or a pass that asks for
    fewer, frees its slot for the next request of that size, so switching back and forth never grows
    the arena. Once full, a freed slot brings a buffer of its own back into the arena (a compiled step
    refuses uniforms that are buffers of their own: labkit.gpu.compiled_step). Slots only ever added
    had filled SmolLM2's arena after six switches of attn_scores."""
    from labkit.gpu.device import get_device
    from labkit.gpu.plan_cache import PlanCache, UniformArena

    gpu = get_device()
    A = UniformArena.ALIGN
    arena = UniformArena(gpu.device, capacity=4 * A)
    a, b = PlanCache(gpu, arena=arena), PlanCache(gpu, arena=arena)

    def one_pass(cache, sizes: list[int], v: int) -> list:
        with cache.one_pass():
            return [cache.uniform(bytes([v]) * n) for n in sizes]

    small = one_pass(a, [16, 16], 1)
    assert [u[1] for u in small] == [0, A] and arena.used == 2 * A
    for v in range(2, 12):  # a stage switching between a kernel with one big uniform and two small ones
        big = one_pass(a, [2 * A], v)
        small = one_pass(a, [16, 16], v)
        assert isinstance(big[0], tuple) and all(isinstance(u, tuple) for u in small), (v, big, small)
    assert arena.used == 4 * A and arena.n_free == 1  # the big slot, free again
    # fill the arena from another cache: b's first uniform takes the freed big slot, its second has none
    got = one_pass(b, [2 * A, 16], 20)
    assert isinstance(got[0], tuple) and not isinstance(got[1], tuple)
    one_pass(a, [16], 30)  # a gives up its second slot
    again = one_pass(b, [2 * A, 16], 21)
    assert all(isinstance(u, tuple) for u in again), again  # b's second uniform is an arena slot now
    assert arena.host[again[1][1] : again[1][1] + 16] == bytes([21]) * 16 and b.n_objects == 0
