"""Decode steps that keep what still holds, on the real wgpu device (labkit.gpu.replay,
gpu/step_refresh.py, gpu/lookahead.py, gpu/plan_cache.py, gpu/fusion.py): generate's cached plans
create no GPU objects once warm, equal steps planned afresh bit for bit, and leak no state: a decode
after another prompt, and a pass after a faulty variant, are bit-identical to a fresh lab's.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import wgpu

import labkit
from labkit.gpu.reuse import Reuse
from labkit.ops.registry import kernel_source

IDS = [1, 5, 9, 7, 3, 2, 11, 4, 8, 6, 10]


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_buffers() -> int:
    gc.collect()
    return wgpu.diagnostics.object_counts.get_dict()["Buffer"]["count"]


@pytest.fixture(scope="module")
def lab(tiny_model):
    return labkit.open(tiny_model("gemma3", "Q8_0"))


def decode(lab, prompt_ids, steps: int, replay: bool = True, lookahead: bool = False, forced=None) -> list[bytes]:
    """Greedy decode as generate runs it (steps replay the last step's plans, and with `lookahead`
    each step is planned while the one before runs), or with every step planned afresh through a
    plan cache; the logits bytes of every step. `forced`: the step tokens, instead of greedy ones."""
    ex = lab.executor
    cache = ex.new_cache(len(prompt_ids) + steps)
    out, ids = [], list(prompt_ids)
    for _ in range(steps):
        if len(ids) == 1 and replay:
            res = ex.run_pass(ids, cache, names=["logits"], last_logits_only=True, reuse=Reuse.steps(),
                              lookahead=lookahead)  # fmt: skip
        else:
            plans = Reuse.objects("decode" if len(ids) == 1 else "prefill")
            res = ex.run_pass(ids, cache, names=["logits"], last_logits_only=True, reuse=plans)
        logits = res.captures["logits"][-1]
        out.append(logits.tobytes())
        ids = [int(np.argmax(logits)) if forced is None else forced[len(out) - 1]]
    return out


def test_warm_decode_creates_no_gpu_objects(lab):
    decode(lab, IDS, 3)
    ex = lab.executor
    replay = ex.step_replay()
    kv = ex.new_cache(len(IDS) + 8)
    ex.run_pass(IDS, kv, names=["logits"], last_logits_only=True, reuse=Reuse.objects("prefill"))
    for step in range(4):
        before = replay.created
        ex.run_pass([3], kv, names=["logits"], last_logits_only=True, reuse=Reuse.steps())
        if step >= 1:  # the first step on a new KV cache binds it once
            assert replay.created == before, f"step {step}: {replay.created - before} GPU objects created"


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_replayed_decode_equals_decode_planned_each_step(tiny_model, arch):
    """Steps that keep the stage plans that still hold give the logits of steps planned afresh, bit for
    bit, across attention maps outgrowing their buffers (pow2 sizes: keys 12 to 40) and a variant
    switch between two decodes."""
    lab = labkit.open(tiny_model(arch, "Q8_0"))
    assert decode(lab, IDS, 30) == decode(lab, IDS, 30, replay=False)
    lab.use("rope", "normal_pairs")
    assert decode(lab, IDS[:4], 12) == decode(lab, IDS[:4], 12, replay=False)


@pytest.mark.parametrize("model", ["gemma3", "llama", "tiny-qwen3moe"])
def test_decode_planned_ahead_equals_decode_planned_each_step(tiny_model, model):
    """Steps planned while the step before runs (labkit.gpu.lookahead), with a placeholder token
    and the embedding planned again for the real one, give the logits of steps planned afresh, bit
    for bit, across attention maps outgrowing their buffers and the MoE router's data-dependent
    experts. A look-ahead made for another KV cache (a new decode at the same position) or before
    a variant switch is not taken."""
    lab = labkit.open(model if model.startswith("tiny-") else tiny_model(model, "Q8_0"))
    replay = lab.executor.step_replay()
    forced = [(7 * i + 3) % 64 + 1 for i in range(30)]  # a new token every step: the placeholder is wrong
    assert decode(lab, IDS, 30, lookahead=True, forced=forced) == decode(lab, IDS, 30, replay=False, forced=forced)
    replay.ahead_taken = 0
    want = decode(lab, IDS, 30, replay=False)
    assert decode(lab, IDS, 30, lookahead=True) == want
    assert replay.ahead_taken == 28, replay.ahead_taken  # every step but the prefill and the first
    assert decode(lab, IDS, 30, lookahead=True) == want  # a new cache: the last look-ahead is left
    assert replay.ahead_taken == 2 * 28, replay.ahead_taken
    lab.use("rope", "normal_pairs")
    assert decode(lab, IDS[:4], 12, lookahead=True) == decode(lab, IDS[:4], 12, replay=False)
    assert not lab.executor.plans_ahead  # lavapipe: the planning would take its cores
    lab.executor.adapter_type = "DiscreteGPU"  # what an H200 reports: generate plans ahead
    steps = [int(np.argmax(np.frombuffer(b, np.float32))) for b in decode(lab, IDS[:4], 6, replay=False)]
    taken = replay.ahead_taken
    assert lab.generate(IDS[:4], max_new_tokens=6).ids == steps
    assert replay.ahead_taken == taken + 4, replay.ahead_taken


def test_a_step_planned_ahead_is_taken_only_by_its_own_step(tiny_model):
    """A look-ahead is made for one KV cache, position and kernel selection: a step of another cache
    at the same position, or of the same cache after a variant switch, plans itself (and gives the
    logits of a step planned afresh)."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex, replay = lab.executor, lab.executor.step_replay()

    def step(cache, token: int, ahead: bool = True) -> bytes:
        res = ex.run_pass([token], cache, names=["logits"], last_logits_only=True, reuse=Reuse.steps(), lookahead=ahead)
        return res.captures["logits"][-1].tobytes()

    def fresh(ids: list[int], token: int) -> bytes:  # the same step in a cache of its own, planned afresh
        cache = ex.new_cache(len(ids) + 1)
        ex.run_pass(ids, cache, names=["logits"], reuse=Reuse.objects("prefill"))
        res = ex.run_pass([token], cache, names=["logits"], last_logits_only=True, reuse=Reuse.objects("decode"))
        return res.captures["logits"][-1].tobytes()

    a, b = ex.new_cache(len(IDS) + 4), ex.new_cache(len(IDS) + 4)
    ex.run_pass(IDS, a, names=["logits"], reuse=Reuse.objects("prefill"))
    step(a, 5)  # plans a's step at len(IDS) + 1 ahead
    ex.run_pass([*IDS, 5], b, names=["logits"], reuse=Reuse.objects("prefill"))  # b at that position too
    taken = replay.ahead_taken
    assert step(b, 9) == fresh([*IDS, 5], 9) and replay.ahead_taken == taken  # not a's plans
    assert replay.ahead is not None and replay.ahead.cache is b  # b's next step, made ahead
    lab.use("rope", "normal_pairs")
    assert step(b, 11) == fresh([*IDS, 5, 9], 11) and replay.ahead_taken == taken  # made before the switch


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_a_warm_step_plans_only_what_reads_the_step(model):
    """A warm decode step plans afresh only the stage that reads the token (embed); those that read
    the position or a longer attention map (rope, attention, softmax) or write the KV cache through a
    matmul (v) keep their dispatches with new uniforms (labkit.gpu.step_refresh); every other stage
    replays its last plan, handed back without its inputs compared. The logits, the dispatches'
    workgroups and the whole KV cache are those of the same steps planned afresh. A lab of its own, as
    the claim is about one decode; a lab that switched kernels many times first is the next test's."""
    lab = labkit.open(model)
    ex = lab.executor
    ids = lab.prompt_ids("The capital of France is")
    kv, fresh = ex.new_cache(24), ex.new_cache(24)  # fresh: the same steps, each planned afresh
    for cache in (kv, fresh):
        ex.run_pass(ids, cache, names=["logits"], last_logits_only=True, reuse=Reuse.objects("prefill"))
    replay, refreshed = ex.step_replay(), set()
    assert len(ids) <= 8
    while kv.n_past < 18:  # to 18 keys: SmolLM2's scores take a second workgroup of keys at 17, in one buffer
        res = ex.run_pass([5 + kv.n_past], kv, names=["logits"], last_logits_only=True, reuse=Reuse.steps())
        want = ex.run_pass(
            [5 + fresh.n_past], fresh, names=["logits"], last_logits_only=True, reuse=Reuse.objects("decode")
        )
        assert res.captures["logits"][-1].tobytes() == want.captures["logits"][-1].tobytes()
        assert replay.at_once or kv.n_past == len(ids) + 1, kv.n_past  # warm: from the kept step whole
        for p, q in zip(res.plans, want.plans, strict=True):  # a moved plan launches what a fresh one does
            if p.stage.name in replay.refreshed:
                assert [d.workgroups for d in p.dispatches] == [d.workgroups for d in q.dispatches], p.stage.name
        refreshed |= set(replay.refreshed)
    queue, n = ex.gpu.device.queue, kv.n_past * lab.config.n_kv_heads * lab.config.head_dim
    for layer, (a, b) in enumerate(zip(kv.k + kv.v, fresh.k + fresh.v, strict=True)):  # every position written
        got, expected = (np.frombuffer(queue.read_buffer(buf), np.float32)[:n] for buf in (a, b))
        assert np.isfinite(expected).all() and got.tobytes() == expected.tobytes(), f"cache buffer {layer}"
    # the last step (18 keys) is in the same pow2 attention-map buffers as the one before
    planned = {st.name for st in lab.graph if st.op == "embed"}
    assert set(replay.replanned) == planned, sorted(set(replay.replanned) ^ planned)
    moved = {st.name for st in lab.graph if st.op in ("rope", "attn_scores", "softmax", "attn_ctx")}
    moved |= {st.name for st in lab.graph if st.op == "matmul" and st.kv_write}
    assert set(replay.refreshed) == moved == refreshed, sorted(set(replay.refreshed) ^ moved)
    assert {st.op for st in lab.graph if st.name not in planned} >= {"matmul", "rmsnorm", "add", "glu"}
    # every other stage was handed back without its inputs compared (StepReplay.unchanged)
    assert replay.handed_back == len(lab.graph) - len(planned | moved), replay.handed_back


def test_a_long_lived_lab_keeps_moving_its_steps_across_kernel_switches(tiny_model):
    """A lab that switches a kernel back and forth, generating under each (a notebook, or a test session's
    shared lab), keeps its warm steps as a fresh lab's: only the embedding planned afresh, rope,
    attention and the KV writers moved to the step (labkit.gpu.step_refresh), and a uniform arena that
    stops growing. Its slots were only ever added, so after a few switches it was full, and every stage
    planned again (here attn_scores) had uniforms of its own, which no refresh can move: planned
    afresh at every step from then on. The text is the same either way; logits are checked elsewhere."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    replay = lab.executor.step_replay()
    embed = {st.name for st in lab.graph if st.op == "embed"}
    scores = {st.name for st in lab.graph if st.op == "attn_scores"}
    used = []
    for _ in range(10):
        lab.use("attn_scores", "decode_uses_prefill")
        lab.generate(IDS, max_new_tokens=3)
        lab.use("attn_scores", "default")
        lab.generate(IDS, max_new_tokens=3)
        decode(lab, IDS, 4)  # steps not planned ahead (generate's are on a GPU): the last one is a real step
        assert set(replay.replanned) == embed, sorted(set(replay.replanned) - embed)
        assert scores <= set(replay.refreshed), sorted(scores - set(replay.refreshed))
        used.append(replay.arena.used)
    assert used[-1] == used[1] < replay.arena.capacity, used  # the second round on takes freed slots


def test_a_warm_step_plans_the_readers_of_a_region_that_moved(tiny_model):
    """A warm step starts from the kept step whole (StepReplay.take_kept_step); when a stage it plans
    moves a region that a stage it would hand back reads (here the embedding's rows, made to move),
    the pass goes on stage by stage, and those readers are planned again over the new region: the
    first norm, and the attention output projection, whose kernel adds the residual stream (the
    embedding) as its fused epilogue. A new token each step, so a stale binding shows: the logits
    equal steps planned afresh, bit for bit."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex, replay = lab.executor, lab.executor.step_replay()
    forced = [(5 * i + 2) % 60 + 1 for i in range(6)]
    want = decode(lab, IDS, 6, replay=False, forced=forced)
    cache, ids, got = ex.new_cache(len(IDS) + 6), list(IDS), []
    readers = {"blk.0.attn_norm", "blk.0.attn_out"}
    for step in range(6):
        if step == 4:  # the embedding's next plan gets a new buffer for its rows
            replay._caches.pop("embed")
        reuse = Reuse.steps() if len(ids) == 1 else Reuse.objects("prefill")
        res = ex.run_pass(ids, cache, names=["logits"], last_logits_only=True, reuse=reuse)
        got.append(res.captures["logits"][-1].tobytes())
        ids = [forced[step]]
        if step == 4:
            assert replay.at_once and readers <= set(replay.replanned), replay.replanned
        elif step >= 2:
            assert replay.at_once and not readers & set(replay.replanned), (step, replay.replanned)
    assert got == want


def test_steps_after_the_fusions_are_worked_out_again_equal_fresh_steps(tiny_model, monkeypatch):
    """The planner's table of fused epilogues is shared by every lab and cleared past 8 selections; a
    step after it was worked out again (a new list, the same fusions) asks every stage again rather
    than handing back a kept step whose moving stages it no longer knows: bit for bit with steps
    planned afresh."""
    from labkit.gpu import planner

    lab = labkit.open(tiny_model("llama", "Q8_0"))
    want = decode(lab, IDS, 8, replay=False)
    rebuilt = planner._epilogues

    def every_step_anew(graph, sel, T):
        planner._EPILOGUES.clear()
        return rebuilt(graph, sel, T)

    monkeypatch.setattr(planner, "_epilogues", every_step_anew)
    assert decode(lab, IDS, 8) == want


def test_cached_plans_leak_no_state(tiny_model):
    """Decode after another prompt equals a fresh lab's decode; a pass after a faulty-variant pass
    equals a fresh lab's pass; both bit for bit."""
    path = tiny_model("gemma3", "Q8_0")
    used, fresh = labkit.open(path), labkit.open(path)
    other = [1, 4, 4, 9, 2, 7, 7, 3]
    decode(used, other, 5)
    assert decode(used, IDS, 6) == decode(fresh, IDS, 6)
    used.use("rmsnorm", "scale_clamp")
    faulty = used.run(IDS)
    used.use("rmsnorm", "default")
    again, clean = used.run(IDS), fresh.run(IDS)
    assert faulty["logits"].tobytes() != clean["logits"].tobytes()
    for name in clean.captures:
        assert again[name].tobytes() == clean[name].tobytes(), name


def test_long_running_lab_is_bounded(tiny_model):
    """200 passes (runs and cached decode steps) and 50 variant switches: RSS and the count of live
    GPU buffers stop growing once warm."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    switches = [("rope", "normal_pairs"), ("rope", "default"), ("softmax", "no_max_sub"), ("softmax", "default"),
                ("matmul_q8_0", "row"), ("matmul_q8_0", "default")]  # fmt: skip

    def rounds(n: int, k0: int) -> None:
        for k in range(k0, k0 + n):
            if k % 4 == 0:
                lab.use(*switches[(k // 4) % len(switches)])
            if k % 2:
                lab.run(IDS if k % 3 else IDS[:5])
            else:
                decode(lab, IDS[: 3 + k % 4], 2)

    rounds(24, 0)  # warm: every switch and shape once
    buffers, rss = live_buffers(), rss_mb()
    rounds(176, 24)  # 176 more rounds: 200 in all, 50 switches
    grown_buffers, grown_rss = live_buffers() - buffers, rss_mb() - rss
    assert grown_buffers <= 50, f"{grown_buffers} more live GPU buffers after 176 more passes"
    assert grown_rss < 60, f"RSS grew {grown_rss:.0f} MB over 176 more passes"


def warm_step_plans(lab) -> dict:
    """The stage plans of a warm replayed decode step after IDS."""
    ex = lab.executor
    kv = ex.new_cache(len(IDS) + 3)
    ex.run_pass(IDS, kv, names=["logits"], last_logits_only=True, reuse=Reuse.objects("prefill"))
    for _ in range(3):
        res = ex.run_pass([5], kv, names=["logits"], last_logits_only=True, reuse=Reuse.steps())
    return {p.stage.name: p for p in res.plans}


def test_decode_fuses_only_correct_elementwise_kernels(tiny_model):
    """In a decode step the residual adds after attn_out and ffn_down, and the gated activation after
    ffn_up, are written by the matmul before them and dispatch nothing themselves; with a user glu
    variant selected, ffn_act runs its own kernel again, so generate shows the variant."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    plans = warm_step_plans(lab)
    fused = {n for p in plans.values() for n in p.also_writes}
    want = {
        s.name
        for s in lab.graph
        if s.layer is not None and s.name.split(".")[-1] in ("resid_mid", "resid_out", "ffn_act")
    }
    assert fused == want, sorted(fused ^ want)
    assert all(not plans[n].dispatches for n in fused)
    source = kernel_source("glu").replace("let a = select(silu(g), gelu_tanh(g), act == 0u);", "let a = max(g, 0.0);")
    labkit.register_variant("glu", "test_relu_decode", source)
    lab.use("glu", "test_relu_decode")
    plans = warm_step_plans(lab)
    assert not any(n.endswith("ffn_act") for p in plans.values() for n in p.also_writes)
    assert all(plans[n].dispatches for n in plans if n.endswith("ffn_act"))
    relu = decode(lab, IDS, 4)
    assert relu == decode(lab, IDS, 4, replay=False)
    lab.use("glu", "default")
    assert relu != decode(lab, IDS, 4), "the glu variant does not show in decode"


def test_a_user_matmul_driver_runs_in_decode_steps(tiny_model):
    """A user's edit of the repacked driver (one source for every token count) has no fused form
    (Kernel.epilogue is None), so in generate's decode steps its matmuls run the user's kernel and
    fuse nothing, and the edit shows. (Fusing used to swap the user's driver for the shipped
    matvec in every decode step.)"""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    driver = kernel_source("matmul_q8_0")  # the tiled driver: the family's interface
    old = "(*acc)[0u + h] += subgroupBroadcast(va, 0u) * m;"
    assert old in driver, "tile16.wgsl changed: update this test's edit"
    new = "(*acc)[0u + h] += 2.0 * subgroupBroadcast(va, 0u) * m;"
    k = labkit.register_variant("matmul_q8_0", "test_decode_x2", driver.replace(old, new))
    assert k.epilogue is None and k.repack is not None
    before = decode(lab, IDS, 3)
    lab.use("matmul_q8_0", "test_decode_x2")
    plans = warm_step_plans(lab)
    fused = {n for p in plans.values() for n in p.also_writes}
    assert not any(n.endswith(("resid_out", "ffn_act", "resid_mid")) for n in fused), sorted(fused)
    assert decode(lab, IDS, 3) != before, "the user's decode driver does not run in decode steps"
    assert decode(lab, IDS, 3) == decode(lab, IDS, 3, replay=False)


def test_replayed_decode_on_a_real_gpu_adapter(tiny_model):
    """With the adapter forced to a discrete GPU (wg_tile matmuls on the GGUF bytes), decode steps
    still replay, bit for bit with steps planned afresh, and nothing is fused: the epilogues belong
    to the repacked matvec."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    lab.executor.adapter_type = "DiscreteGPU"
    assert lab.kernels()["q"]["kernel"] == "wg_tile"
    assert decode(lab, IDS, 12) == decode(lab, IDS, 12, replay=False)
    plans = warm_step_plans(lab)
    assert not any(p.also_writes for p in plans.values())
    assert all(plans[n].dispatches for n in plans if n.endswith(("resid_mid", "ffn_act")))


def test_a_run_never_sees_the_run_before(tiny_model):
    """Short runs reuse the last run's buffers (warm pages), cleared first: a faulty run that leaves the
    last lm_head window unwritten, after a correct run, reads those rows as 0.0, as in a fresh lab."""
    path = tiny_model("gemma3", "Q8_0")
    used, fresh = labkit.open(path, window_bytes=4096), labkit.open(path, window_bytes=4096)
    used.run(IDS)
    used.use("lm_head", "skip_last_window")
    fresh.use("lm_head", "skip_last_window")
    faulty, want = used.run(IDS[::-1]), fresh.run(IDS[::-1])  # same shapes: the same buffers
    assert (faulty["logits"] == 0).any(), "the faulty policy left no row unwritten here"
    for name in want.captures:
        assert faulty[name].tobytes() == want[name].tobytes(), name
