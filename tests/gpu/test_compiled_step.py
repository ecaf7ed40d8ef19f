"""Compiled decode steps, on the real wgpu device (labkit.gpu.compiled_step, gpu/plan_cache.py,
gpu/fusion.py): a warm step plans nothing and creates no GPU object, moves only its ops' declared
step fields, equals steps planned afresh bit for bit, compiles again when it no longer holds, and
leaks no state: a decode after another prompt, and a pass after a faulty variant, are bit-identical
to a fresh lab's.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import wgpu

import labkit
from labkit.gpu.pass_request import PassRequest
from labkit.gpu.planner import plan_pass
from labkit.gpu.reuse import Reuse
from labkit.ops.base import PassShape
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


def decode(lab, prompt_ids, steps: int, replay: bool = True, forced=None) -> list[bytes]:
    """Greedy decode as generate runs it (`replay`: steps run the compiled step), or with every step
    planned afresh through a plan cache; the logits bytes of every step. `forced`: the step tokens,
    instead of greedy ones."""
    ex = lab.executor
    state = ex.new_state(len(prompt_ids) + steps)
    out, ids = [], list(prompt_ids)
    for _ in range(steps):
        if len(ids) == 1 and replay:
            res = ex.run_pass(PassRequest(ids, names=("logits",), last_logits_only=True, reuse=Reuse.steps()), state)
        else:
            plans = Reuse.objects("decode" if len(ids) == 1 else "prefill")
            res = ex.run_pass(PassRequest(ids, names=("logits",), last_logits_only=True, reuse=plans), state)
        logits = res.captures["logits"][-1]
        out.append(logits.tobytes())
        ids = [int(np.argmax(logits)) if forced is None else forced[len(out) - 1]]
    return out


def test_a_warm_step_plans_nothing_and_creates_no_gpu_objects(lab, monkeypatch):
    """Once compiled, a step writes its moving words and submits what was recorded: the planner is
    not called (it was, three times, to compile), no buffer is made, and the step is taken again."""
    from labkit.gpu import compiled_step

    calls = []
    monkeypatch.setattr(compiled_step, "plan_pass", lambda *a, **k: calls.append(1) or plan_pass(*a, **k))
    ex = lab.executor
    kv = ex.new_state(len(IDS) + 8)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), kv)
    ex.run_pass(PassRequest([3], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
    step, compiled = kv.step, ex.compiled_steps.compiled
    assert step is not None and calls == [1] * compiled_step.COMPILE_AT
    warm = min(step.max_keys, kv.kv.capacity) - kv.n_past  # steps until the cache is full
    assert warm >= 3, warm
    buffers, created = live_buffers(), step.objects.created
    for _ in range(warm):
        ex.run_pass(PassRequest([3], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
    assert kv.step is step and ex.compiled_steps.compiled == compiled and step.steps == warm + 1
    assert len(calls) == compiled_step.COMPILE_AT, "a warm step was planned"
    assert step.objects.created == created and live_buffers() <= buffers, "a warm step made GPU objects"


def step_request(token: int) -> PassRequest:
    return PassRequest([token], names=("logits",), last_logits_only=True, reuse=Reuse.steps())


def test_a_warm_step_submits_the_encoder_the_step_before_recorded(lab, monkeypatch):
    """While a step runs on the GPU, the next one's moving words are written and its encoder recorded
    (`CompiledStep.ahead`): a warm step takes that encoder and records only the next one's, so its host
    time up to the submit is its token's row; the last step that fits the cache records none."""
    from labkit.gpu import compiled_step, submitter

    ex = lab.executor
    ex.submitter.record_ahead = True  # as where the host has a core to spare (GpuDevice.has_spare_core)
    state = ex.new_state(len(IDS) + 5)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), state)
    ex.run_pass(step_request(3), state)
    step = state.step
    assert step.ahead is not None and step.ahead.n_past == state.n_past and step.values_at == state.n_past
    taken, recorded = [], []
    take, record = compiled_step.CompiledStep.take_ahead, submitter.Submitter._record_step
    monkeypatch.setattr(compiled_step.CompiledStep, "take_ahead", lambda s, *a: taken.append(take(s, *a)) or taken[-1])
    monkeypatch.setattr(submitter.Submitter, "_record_step", lambda s, *a: recorded.append(1) or record(s, *a))
    for token in (5, 9, 2, 7):
        ex.run_pass(step_request(token), state)
    assert state.step is step and all(t is not None for t in taken) and len(taken) == 4
    assert len(recorded) == 3 and step.ahead is None, "the step that filled the cache recorded one ahead"


def test_an_encoder_recorded_ahead_is_taken_only_where_it_holds(tiny_model):
    """An encoder recorded ahead is for one position and one staging buffer: a step after a rewind (another
    position), or after a pass that read back more than the staging buffer held (it was replaced), records
    its own, and every step equals one planned afresh, bit for bit."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex = lab.executor
    ex.submitter.record_ahead = True
    state, other = ex.new_state(len(IDS) + 8), ex.new_state(len(IDS) + 1)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), state)
    first = ex.run_pass(step_request(5), state).captures["logits"][-1].tobytes()
    state.kv.rewind(1)  # the same step again, at the position before the one recorded ahead
    assert state.step.ahead.n_past == state.n_past + 1
    again = ex.run_pass(step_request(5), state).captures["logits"][-1].tobytes()
    staging = ex.submitter._staging
    ex.run_pass(PassRequest(IDS), other)  # every stage read back, through a bigger staging buffer of its own
    assert ex.submitter._staging is not staging and state.step.ahead.staging is staging
    then = ex.run_pass(step_request(9), state).captures["logits"][-1].tobytes()
    fresh = decode(lab, IDS, 3, replay=False, forced=[5, 9, 0])
    assert first == again == fresh[1] and then == fresh[2]


def test_without_a_spare_core_a_step_records_its_own_encoder(tiny_model):
    """Where the device's threads take every core (lavapipe's default), recording ahead would take a core
    from them, so no step is recorded ahead: each step records its own at its start, and the steps are
    the same, bit for bit."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex = lab.executor
    ex.submitter.record_ahead = False
    state = ex.new_state(len(IDS) + 6)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), state)
    got = [ex.run_pass(step_request(t), state) for t in (5, 9, 2)]
    assert state.step is not None and state.step.ahead is None
    assert [r.timings["recorded_ahead"] for r in got] == [0.0, 0.0, 0.0]
    fresh = decode(lab, IDS, 4, replay=False, forced=[5, 9, 2, 0])
    assert [r.captures["logits"][-1].tobytes() for r in got] == fresh[1:]


def test_a_spare_core_is_one_the_devices_threads_leave_free(lab, monkeypatch):
    """A real GPU leaves the host's cores free; lavapipe runs LP_NUM_THREADS threads, else one a core."""
    from dataclasses import replace

    from labkit.gpu import device

    gpu = replace(lab.executor.gpu, adapter_type="CPU")
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    assert not gpu.has_spare_core
    for threads, spare in (("1", True), ("2", False), ("8", False), ("many", False)):
        monkeypatch.setenv("LP_NUM_THREADS", threads)
        assert gpu.has_spare_core == spare, threads
    assert replace(gpu, adapter_type="DiscreteGPU").has_spare_core


@pytest.mark.parametrize("arch", ["gemma3", "llama", "tiny-qwen3moe"])
def test_compiled_decode_equals_decode_planned_each_step(tiny_model, arch):
    """Compiled steps give the logits of steps planned afresh, bit for bit, across attention maps
    outgrowing their buffers (pow2 sizes: keys 12 to 40, each a new compile), a new token each step
    (the embedding's row written for it), the MoE router's data-dependent experts, and a variant
    switch between two decodes."""
    lab = labkit.open(arch if arch.startswith("tiny-") else tiny_model(arch, "Q8_0"))
    assert decode(lab, IDS, 30) == decode(lab, IDS, 30, replay=False)
    forced = [(7 * i + 3) % 64 + 1 for i in range(30)]
    assert decode(lab, IDS, 30, forced=forced) == decode(lab, IDS, 30, replay=False, forced=forced)
    lab.use("rope", "normal_pairs")
    assert decode(lab, IDS[:4], 12) == decode(lab, IDS[:4], 12, replay=False)


def test_a_compiled_step_holds_for_its_own_cache_and_selection_only(tiny_model):
    """A compiled step is made for one KV cache, capture and kernel selection: a step of another cache
    at the same position, or of the same cache after a variant switch, compiles again (and gives the
    logits of a step planned afresh); generate on a real GPU's adapter kind compiles its own."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex, steps = lab.executor, lab.executor.compiled_steps

    def step(state, token: int) -> bytes:
        res = ex.run_pass(PassRequest([token], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), state)
        return res.captures["logits"][-1].tobytes()

    def fresh(ids: list[int], token: int) -> bytes:  # the same step in a cache of its own, planned afresh
        state = ex.new_state(len(ids) + 1)
        ex.run_pass(PassRequest(ids, names=("logits",), reuse=Reuse.objects("prefill")), state)
        res = ex.run_pass(
            PassRequest([token], names=("logits",), last_logits_only=True, reuse=Reuse.objects("decode")), state
        )
        return res.captures["logits"][-1].tobytes()

    a, b = ex.new_state(len(IDS) + 8), ex.new_state(len(IDS) + 8)
    ex.run_pass(PassRequest(IDS, names=("logits",), reuse=Reuse.objects("prefill")), a)
    assert step(a, 5) == fresh(IDS, 5) and a.step.kv is a.kv
    ex.run_pass(PassRequest([*IDS, 5], names=("logits",), reuse=Reuse.objects("prefill")), b)  # b one position on
    compiled = steps.compiled
    assert step(b, 9) == fresh([*IDS, 5], 9) and b.step.kv is b.kv and steps.compiled == compiled + 1
    lab.use("rope", "normal_pairs")
    assert step(b, 11) == fresh([*IDS, 5, 9], 11) and steps.compiled == compiled + 2
    lab.use("rope", "default")
    lab.executor.adapter_type = "DiscreteGPU"  # what an H200 reports: other kernels, another step
    tokens = [int(np.argmax(np.frombuffer(x, np.float32))) for x in decode(lab, IDS[:4], 6, replay=False)]
    compiled = steps.compiled
    assert lab.generate(IDS[:4], max_new_tokens=6).ids == tokens and steps.compiled > compiled


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_a_warm_step_moves_only_its_ops_step_fields(model):
    """A compiled step's moving words belong to the stages that read the position: rope, attention,
    softmax and the matmul that writes V into the cache, and to no other; the embedding's row is
    written for the token. The logits, the attention scores' workgroups (their op's rule, each step)
    and the whole KV cache are those of the same steps planned afresh. A lab of its own: the claim is
    about one decode."""
    lab = labkit.open(model)
    ex = lab.executor
    ids = lab.prompt_ids("The capital of France is")
    kv, fresh = ex.new_state(24), ex.new_state(24)  # fresh: the same steps, each planned afresh
    for state in (kv, fresh):
        ex.run_pass(PassRequest(ids, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), state)
    assert len(ids) <= 8
    while kv.n_past < 18:  # to 18 keys: SmolLM2's scores take a second workgroup of keys at 17
        res = ex.run_pass(
            PassRequest([5 + kv.n_past], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv
        )
        want = ex.run_pass(
            PassRequest([5 + fresh.n_past], names=("logits",), last_logits_only=True, reuse=Reuse.objects("decode")),
            fresh,
        )
        assert res.captures["logits"][-1].tobytes() == want.captures["logits"][-1].tobytes()
        for p, q in zip(res.plans, want.plans, strict=True):
            if p.stage.op == "attn_scores":
                assert [d.workgroups for d in p.dispatches] == [d.workgroups for d in q.dispatches], p.stage.name
    queue, n = ex.gpu.device.queue, kv.n_past * lab.config.n_kv_heads * lab.config.head_dim
    for layer, (a, b) in enumerate(
        zip(kv.kv.k + kv.kv.v, fresh.kv.k + fresh.kv.v, strict=True)
    ):  # every position written
        got, expected = (np.frombuffer(queue.read_buffer(buf), np.float32)[:n] for buf in (a, b))
        assert np.isfinite(expected).all() and got.tobytes() == expected.tobytes(), f"cache buffer {layer}"
    step = kv.step
    moved = {st.name for st in lab.graph if st.op in ("rope", "attn_scores", "softmax", "attn_ctx")}
    moved |= {st.name for st in lab.graph if st.op == "matmul" and st.kv_write}
    assert step.moving_stages == moved, sorted(step.moving_stages ^ moved)
    assert [name for _, name in step.embed] == ["token_embd.weight"]


def test_a_long_lived_lab_compiles_again_after_each_switch(tiny_model):
    """A lab that switches a kernel back and forth, generating under each (a notebook, or a test
    session's shared lab), compiles a step for each selection and takes it: its steps equal steps
    planned afresh, and what a compiled step holds does not grow from one switch to the next."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    steps = lab.executor.compiled_steps
    used, held = [], []
    for _ in range(6):
        lab.use("attn_scores", "decode_uses_prefill")
        lab.generate(IDS, max_new_tokens=3)
        lab.use("attn_scores", "default")
        lab.generate(IDS, max_new_tokens=3)
        assert decode(lab, IDS, 4) == decode(lab, IDS, 4, replay=False)
        assert steps.last is not None and steps.last.steps >= 1
        used.append(steps.last.objects.arena.used)
        held.append(steps.last.objects.n_objects)
    assert len(set(used)) == 1 and len(set(held)) == 1, (used, held)


def test_a_step_compiles_once_for_its_cache_and_again_only_when_its_maps_are_outgrown(tiny_model, monkeypatch):
    """A compiled step's attention maps hold its KV cache's capacity, so over a whole decode no region
    moves and the step is compiled once. Where that would not fit one binding, the maps hold the power
    of two at or above a step's keys (forced here): the step holds until one more key would not fit,
    and is compiled again then, and only then. Both decode as steps planned afresh do."""
    from labkit.gpu import compiled_step

    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex, steps = lab.executor, lab.executor.compiled_steps

    def run(capacity: int) -> tuple[list[int], list[bytes]]:
        kv = ex.new_state(capacity)
        ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), kv)
        compiles, logits = [], []
        for _ in range(36):
            before, held = steps.compiled, kv.step
            outgrown = held is None or kv.n_past + 1 > held.max_keys
            res = ex.run_pass(PassRequest([3], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
            assert (steps.compiled == before + 1) == outgrown, (kv.n_past, before, steps.compiled)
            compiles += [kv.n_past] if outgrown else []
            logits.append(res.captures["logits"][-1].tobytes())
        return compiles, logits

    capacity = len(IDS) + 40
    once, logits = run(capacity)
    assert len(once) == 1, once
    assert logits == decode(lab, IDS, 37, replay=False, forced=[3] * 37)[1:]
    monkeypatch.setattr(compiled_step, "plan_pass", lambda *a, **k: plan_pass(*a, **{**k, "keys_room": 0}))
    grown, again = run(capacity)
    assert len(grown) >= 3, grown  # 12 to 47 keys: at least the 16 and 32 boundaries
    assert again == logits


def test_an_attention_maps_room_is_kept_within_one_binding(tiny_model):
    """`keys_room` sizes an attention map's buffer for more keys only where that fits one storage
    binding; otherwise the map's buffer is its own size (and a compiled step over it holds to its
    power of two)."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex = lab.executor
    st = next(s for s in lab.graph if s.op == "attn_scores")
    shape, fresh = (lab.config.n_heads, 1, 12), ex.gpu.fresh
    pass_shape = PassShape(1, 11)
    roomy = ex.region(st, shape, pass_shape, fresh, keys_room=40)
    assert roomy.shape == shape and roomy.buffer.size == 4 * lab.config.n_heads * 40
    too_big = ex.binding_limit // (4 * lab.config.n_heads) + 1
    plain = ex.region(st, shape, pass_shape, fresh, keys_room=too_big)
    assert plain.buffer.size == 4 * lab.config.n_heads * 12


def test_a_capture_of_a_kv_writer_is_planned_each_step(tiny_model):
    """A KV writer's region is the cache at the step's position, so a step that captures one (here V
    and the first layer's attention map) is not compiled: it is planned over the decode role's objects,
    and its captures are those of the same step planned afresh."""
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    ex = lab.executor
    names = ["blk.0.v", "blk.0.attn_probs", "logits"]
    got, want = ex.new_state(len(IDS) + 3), ex.new_state(len(IDS) + 3)
    for state in (got, want):
        ex.run_pass(PassRequest(IDS, names=("logits",), reuse=Reuse.objects("prefill")), state)
    for token in (3, 8):
        a = ex.run_pass(PassRequest([token], names=names, last_logits_only=True, reuse=Reuse.steps()), got)
        b = ex.run_pass(PassRequest([token], names=names, last_logits_only=True, reuse=Reuse.objects("fresh")), want)
        for name in names:
            assert a.captures[name].tobytes() == b.captures[name].tobytes(), name
    assert got.step is None


def test_a_step_whose_compiling_raises_leaves_no_step(tiny_model, monkeypatch):
    """A compile that raises midway (a student's kernel, planned at the second position) leaves no
    compiled step and the cache where it was; the next step compiles and equals a fresh one."""
    from labkit.gpu import compiled_step

    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ex = lab.executor
    kv = ex.new_state(len(IDS) + 4)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), kv)
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a student's kernel")
        return plan_pass(*a, **k)

    monkeypatch.setattr(compiled_step, "plan_pass", flaky)
    with pytest.raises(RuntimeError, match="student"):
        ex.run_pass(PassRequest([3], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
    assert kv.step is None and kv.n_past == len(IDS)
    got = ex.run_pass(PassRequest([3], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
    assert kv.step is not None
    want = decode(lab, IDS, 2, replay=False, forced=[3, 3])[1]
    assert got.captures["logits"][-1].tobytes() == want


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
    """The stage plans of a warm compiled decode step after IDS."""
    ex = lab.executor
    kv = ex.new_state(len(IDS) + 3)
    ex.run_pass(PassRequest(IDS, names=("logits",), last_logits_only=True, reuse=Reuse.objects("prefill")), kv)
    for _ in range(3):
        res = ex.run_pass(PassRequest([5], names=("logits",), last_logits_only=True, reuse=Reuse.steps()), kv)
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


def test_compiled_decode_on_a_real_gpu_adapter(tiny_model):
    """With the adapter forced to a discrete GPU (wg_tile matmuls on the GGUF bytes), decode steps
    are still compiled, bit for bit with steps planned afresh, and nothing is fused: the epilogues
    belong to the repacked matvec."""
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


def test_generate_keeps_its_state_for_the_next_generate_of_that_capacity(tiny_model):
    """A generate of the same capacity runs on the last one's PassState, rewound: its compiled step
    holds (nothing compiled again) and the tokens are those of a lab that never generated before;
    another capacity makes a new state and compiles its own step."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    steps = lab.executor.compiled_steps
    first = lab.generate(IDS, max_new_tokens=6)
    compiled, state = steps.compiled, lab._generate_held
    again = lab.generate(IDS, max_new_tokens=6)
    assert again.ids == first.ids and steps.compiled == compiled and lab._generate_held is state
    assert state.step is steps.last and state.step.steps >= 2 * 5
    other = lab.generate(IDS, max_new_tokens=9)
    assert lab._generate_held is not state and steps.compiled == compiled + 1
    assert other.ids[: len(first.ids)] == first.ids
    assert labkit.open(tiny_model("llama", "Q8_0")).generate(IDS, max_new_tokens=6).ids == first.ids


@pytest.mark.parametrize("arch", ["gemma3", "tiny-qwen3moe"])
def test_a_greedy_step_reads_back_its_token_only(tiny_model, arch):
    """Greedy decoding picks the next token on the device (labkit.ops.argmax after the logits; by default on a
    real GPU): a warm step reads back 4 bytes, compiled, and the tokens are the reference's greedy ones, and
    those of the host's pick; a sampled decode reads its row of logits, as before."""
    lab = labkit.open(arch if arch.startswith("tiny-") else tiny_model(arch, "Q8_0"))
    assert lab.executor.picks_on_device == (lab.executor.adapter == "gpu")  # lavapipe reads its logits back
    lab.executor.pick_on_device = True
    greedy = lab.generate(IDS, max_new_tokens=8)
    assert greedy.ids == lab.generate_reference(IDS, max_new_tokens=8).ids
    assert greedy.timings["readback_bytes_per_step"] == 4 and lab.executor.compiled_steps.last is not None
    lab.executor.pick_on_device = False
    assert lab.generate(IDS, max_new_tokens=8).ids == greedy.ids
    sampled = lab.generate(IDS, max_new_tokens=4, sampler=labkit.Sampler(temperature=0.7, seed=3))
    assert sampled.timings["readback_bytes_per_step"] == 4 * lab.config.vocab_size


def test_a_pick_the_device_cannot_make_is_refused(tiny_model):
    from labkit.errors import InvalidArgumentError
    from labkit.gpu.pass_request import PassRequest

    ex = labkit.open(tiny_model("llama", "Q8_0")).executor
    with pytest.raises(InvalidArgumentError, match="pick='top_k'"):
        ex.run_pass(PassRequest(tuple(IDS), names=(), pick="top_k"), ex.new_state(len(IDS)))


def test_stages_reading_one_input_fill_one_texture(smollm):
    """q, k and v read the attention norm's rows as their X texture: one fill serves the three (and one the
    FFN's gate and up), so a SmolLM2 decode step is 18 dispatches a layer where it was 21, and its tokens
    are the reference's."""
    lab = smollm
    gen = lab.generate("The color of the sky is", max_new_tokens=6)
    assert gen.ids == lab.generate_reference("The color of the sky is", max_new_tokens=6).ids
    plans = {p.stage.kind: p for p in lab.executor.compiled_steps.last.plans if p.stage.layer == 3}
    fills = {k for k, p in plans.items() for d in p.dispatches if d.label.startswith("to texture")}
    assert fills == {"q", "attn_out", "ffn_gate", "ffn_down"}
    assert sum(len(p.dispatches) for p in plans.values()) == 18
