"""The GPU executor end to end: every stage against the float64 reference, batched vs
stepped captures, poison detection, KV-cached decode, and the llama.cpp golden files."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.gpu.executor import POISON_BITS
from labkit.gpu.pass_request import PassRequest

from conftest import REAL_MODELS, _open_cached, check_against_golden, golden

IDS = [1, 5, 9, 7, 3, 2, 11, 4, 8]


@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
@pytest.mark.parametrize("fmt", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"])
def test_every_stage_matches_reference_on_tiny(tiny_model, arch, fmt):
    lab = labkit.open(tiny_model(arch, fmt))
    cmp = labkit.compare(lab.run(IDS), lab.reference(IDS))
    assert cmp.passed, cmp.table(only_failed=True)
    assert not cmp.missing


@pytest.mark.parametrize("variants", [{}, {"attn_ctx": "streaming"}], ids=["default", "streaming"])
def test_stepped_and_batched_captures_are_bit_identical(tiny_model, variants):
    """Under a fused attention variant the scores and probs are not computed: neither the batched
    run nor the stepper may hand back (zero) arrays for them; asking the stepper is an error."""
    lab = labkit.open(tiny_model("gemma3", "Q4_K"), variants=variants)
    fused = bool(variants)
    not_computed = {n for n in lab.stages if n.endswith(("attn_scores", "attn_probs"))} if fused else set()
    batched = lab.run(IDS)
    assert set(batched.captures) == set(lab.stages) - not_computed
    st = lab.step(IDS)
    assert st.current is None
    first = st.next()
    assert first == "embed" and st.current == "embed"
    if fused:
        for name in ("blk.0.attn_probs", "blk.1.attn_scores"):
            with pytest.raises(labkit.errors.UnknownStageError, match="streaming"):
                st.run_to(name)
            with pytest.raises(labkit.errors.UnknownStageError, match="does not"):
                st[name]
        assert st.current == "embed", "asking for a skipped stage must not run anything"
        st.run_to("blk.0.attn_ctx")
        assert st.current == "blk.0.attn_ctx"
    else:
        st.run_to("blk.0.attn_probs")
        assert st.current == "blk.0.attn_probs"
    ran = [st.current]
    while not st.done:
        ran.append(st.next())
    assert not_computed.isdisjoint(ran)
    assert set(st.captures) == set(batched.captures)
    for name in batched.captures:
        a, b = batched[name], st[name]
        assert a.tobytes() == b.tobytes(), f"{name}: stepped and batched differ (max {np.abs(a - b).max()})"
        assert np.any(a != 0), f"{name}: capture is all zeros"
    stepped_run = lab.run(IDS, stepped=True)
    assert set(stepped_run.captures) == set(batched.captures)
    assert all(stepped_run[n].tobytes() == batched[n].tobytes() for n in batched.captures)


def test_debug_mode_reports_zero_unwritten_and_catches_a_skipped_dispatch(tiny_model):
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    run = lab.run(IDS, debug=True)
    assert run.unwritten and all(v == 0 for v in run.unwritten.values()), run.unwritten
    # Drop the last window's dispatch of the logits: the poison must show exactly there.
    ex = lab.executor
    plans = ex.plan(IDS, ex.new_cache(len(IDS)))
    logits = plans[-1]
    logits.dispatches = logits.dispatches[:0]
    from labkit.gpu.executor import poison_region, record_stage
    from labkit.gpu.readback import Readback

    poison_region(ex.device, logits.out)
    enc = ex.device.create_command_encoder()
    for p in plans:
        record_stage(enc, p)
    readback = Readback(ex.device, [logits], len(IDS))
    readback.record(enc)
    ex.device.queue.submit([enc.finish()])
    got = readback.read()[0]["logits"]
    assert np.all(got.view(np.uint32) == POISON_BITS)


def test_names_filter_captures_only_what_is_asked(tiny_model):
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    run = lab.run(IDS, names=["blk.1.attn_probs", "logits"])
    assert set(run.captures) == {"blk.1.attn_probs", "logits"}
    with pytest.raises(labkit.errors.UnknownStageError):
        run["blk.0.q"]


@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
def test_kv_cached_decode_matches_reference_decode(tiny_model, arch):
    lab = labkit.open(tiny_model(arch, "Q8_0"))
    gpu = lab.generate(IDS, max_new_tokens=6)
    ref = lab.generate_reference(IDS, max_new_tokens=6)
    assert gpu.ids == ref.ids


@pytest.mark.parametrize("adapter", ["CPU", "DiscreteGPU"])
@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
def test_decode_pass_stages_match_reference_with_cache(tiny_model, arch, adapter):
    """Decode steps (T=1 after 9 and 10 cached positions, past the gemma window of 4) stage by
    stage, on the same KV history as the reference. qwen2's biased v goes into the cache at n_past.
    Under a discrete GPU's adapter type the defaults are a real GPU's (wide rmsnorm, masked_wide
    context, wg_tile matmuls), run here on lavapipe."""
    from labkit.captures import Run
    from labkit.model.reference import KVCache

    lab = labkit.open(tiny_model(arch, "Q5_0"))
    ex = lab.executor
    ex.adapter_type = adapter
    assert lab.kernels()["attn_ctx"]["kernel"] == ("masked_wide" if adapter == "DiscreteGPU" else "masked")
    state = ex.new_state(len(IDS) + 2)
    ex.run_pass(PassRequest(IDS, names=()), state)
    rc = KVCache()
    lab.reference_engine.forward(IDS, rc, capture=[])
    for tok in (6, 10):
        dec = ex.run_pass(PassRequest([tok], debug=True), state)
        ref = lab.reference_engine.forward([tok], rc)
        a = Run(lab.name, "gpu", [tok], lab.stages, dec.captures, unwritten=dec.unwritten)
        b = Run(lab.name, "reference", [tok], lab.stages, ref)
        cmp = labkit.compare(a, b)
        assert cmp.passed and not cmp.missing, f"decode at n_past={rc.n_past - 1}:\n" + cmp.table(only_failed=True)
        assert sum(dec.unwritten.values()) == 0, {k: v for k, v in dec.unwritten.items() if v}
        assert a["blk.0.attn_scores"].shape == (lab.config.n_heads, 1, rc.n_past)


def test_sampler_distribution_on_gpu_matches_host(tiny_model):
    from labkit.gpu.sampling import GpuSampler

    lab = labkit.open(tiny_model("llama", "Q8_0"))
    logits = np.random.default_rng(0).standard_normal(lab.config.vocab_size) * 3
    for s in (labkit.Sampler(0.7, 40, 0.9, 1), labkit.Sampler(1.3, 0, 0.5, 2), labkit.Sampler(1.0, 5, 1.0, 3)):
        ids_g, p_g = GpuSampler(lab.executor, s).distribution(logits)
        ids_h, p_h = s.distribution(logits)
        assert list(ids_g) == list(ids_h)
        assert np.allclose(p_g, p_h, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_every_stage_matches_reference(model):
    lab = _open_cached(model)
    prompt = "The color of the sky is"
    run = lab.run(prompt, debug=True)
    assert sum(run.unwritten.values()) == 0
    cmp = labkit.compare(run, lab.reference(prompt))
    assert cmp.passed, cmp.table(only_failed=True)
    entry = golden(model)["prompts"][0]
    check_against_golden(run.logits(-1), entry, tol=0.5, raw_tol=0.5)
    if model == "gemma3-270m":  # smollm2's 3rd and 4th are 0.06 apart in llama.cpp: noise decides
        assert [t.piece for t in run.top(3)] == [" a", " the", " blue"]


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_gpu_matches_llamacpp_golden(model):
    lab = _open_cached(model)
    greedy_equal = 0
    prompts = golden(model)["prompts"]
    for entry in prompts:
        run = lab.run(entry["tokens"], names=["logits"])
        check_against_golden(run.logits(-1), entry)
        gen = lab.generate(entry["tokens"], max_new_tokens=8)
        greedy_equal += gen.ids == entry["greedy"]
    assert greedy_equal >= 3, f"greedy 8-token continuations equal llama.cpp's on {greedy_equal}/{len(prompts)}"


def test_logits_chunked_by_tokens_above_the_binding_limit(tiny_model):
    """Gemma's logits are [T, 262144]: past ~128 tokens they exceed one 128 MiB storage binding.
    Here a lowered limit (32 KiB) makes a tiny model's [9, 2048] logits (72 KiB) span several
    bindings, with two weight windows: every (window, token chunk) pair is one dispatch."""
    lab = labkit.open(tiny_model("llama", "Q8_0", vocab=2048), window_bytes=1024 * 272)
    ex = lab.executor
    ex.max_binding = 32 << 10
    plans = ex.plan(IDS, ex.new_cache(len(IDS)))
    logits = plans[-1]
    n_windows = len(ex.weight("token_embd.weight").windows)
    assert n_windows == 2 and logits.out.size * 4 > ex.max_binding
    matmuls = [d for d in logits.dispatches if d.label.startswith("matmul ")]  # not the X texture fills
    assert len(matmuls) > n_windows and len(matmuls) % n_windows == 0
    run = lab.run(IDS, debug=True)
    assert sum(run.unwritten.values()) == 0, {k: v for k, v in run.unwritten.items() if v}
    cmp = labkit.compare(run, lab.reference(IDS))
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    # the lm_head window filter still drops a whole weight window, across every token chunk
    lab.use("lm_head", "skip_last_window")
    bad = lab.run(IDS, debug=True)
    last_rows = ex.weight("token_embd.weight").windows[-1].n_rows
    assert bad.unwritten["logits"] == len(IDS) * last_rows
    assert bad.stats("logits", pos=-1).unwritten == last_rows
    assert bad.stats("logits", pos=0).unwritten == last_rows
    assert bad.stats("output_norm", pos=-1).unwritten == 0


def test_scores_above_the_binding_limit_raise_prompt_too_long(tiny_model):
    """A non-matmul region above the binding limit (attn_scores [H, T, T] at thousands of tokens on
    Gemma) is a typed PromptTooLongError that names the stage and the way out, not a GPU validation
    error; the fused streaming attention does not materialize scores and runs."""
    path = tiny_model("llama", "Q8_0")
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 512, 200)]
    lab = labkit.open(path)
    lab.executor.max_binding = 512 << 10  # scores: 4 x 200 x 200 x 4 bytes = 625 KiB
    with pytest.raises(labkit.errors.PromptTooLongError) as e:
        lab.run(ids)
    msg = str(e.value)
    assert "blk.0.attn_scores" in msg and "0.6 MiB" in msg and "200 tokens" in msg, msg
    assert '"attn_ctx": "tiled"' in msg, msg  # the fast fused tier, which reaches 200 keys under the loop cap
    fused = labkit.open(path, variants={"attn_ctx": "streaming"})
    fused.executor.max_binding = 512 << 10
    run = fused.run(ids)
    cmp = labkit.compare(run, fused.reference(ids))
    assert cmp.passed, cmp.table(only_failed=True)
    assert set(cmp.missing) == {n for n in fused.stages if n.endswith(("attn_scores", "attn_probs"))}


def test_unknown_names_in_filter_raise(tiny_model):
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    for fn in (lab.run, lab.reference):
        with pytest.raises(labkit.errors.UnknownStageError, match=r"blk\.0\.atn_probs.*nope|nope.*atn_probs"):
            fn(IDS, names=["blk.0.attn_probs", "blk.0.atn_probs", "nope"])
        assert set(fn(IDS, names=["logits"]).captures) == {"logits"}


def test_the_kv_cache_owns_its_position():
    """A pass advances the cache by its tokens and a re-run of them rewinds first; neither may
    leave the cache's capacity (a write past it would land outside the K and V buffers)."""
    from labkit.gpu.kv_cache import GpuKVCache

    cache = GpuKVCache(8, [object()], [object()])
    cache.advance(5)
    cache.rewind(5)
    cache.advance(5)
    cache.advance(3)
    assert cache.n_past == 8
    with pytest.raises(ValueError, match="holds 8 positions"):
        cache.advance(1)
    with pytest.raises(ValueError, match="cannot rewind 9"):
        cache.rewind(9)
    assert cache.n_past == 8


def test_stage_times_run_from_the_stage_before_to_their_own_end():
    """lavapipe may write a small dispatch's begin timestamp after it ran: its time is the gap
    before its window, and must be charged to it, not lost (nor to the stage before)."""
    from labkit.gpu.submitter import stage_times_ms

    ticks = np.array([[0, 5_000_000], [9_000_000, 9_100_000], [9_200_000, 12_200_000]], dtype=np.uint64)
    assert stage_times_ms(ticks) == [5.0, 4.1, 3.1]
    assert stage_times_ms(np.zeros((0, 2), np.uint64)) == []


def test_a_timed_pass_charges_every_stage_its_time(tiny_model):
    """No stage's time is negative, and together they are no more than the pass's wall time (the
    times tile the GPU's span: nothing is charged twice)."""
    lab = labkit.open(tiny_model("llama", "Q8_0"))
    ids = list(range(1, 41))
    lab.run(ids, names=["logits"])
    lab.forget_last_pass()
    t = lab.run(ids, names=["logits"], timestamps=True).timings
    if "stage_ms" not in t:
        pytest.skip("no timestamp queries on this adapter")
    ms = t["stage_ms"]
    assert all(v >= 0 for v in ms.values()), ms
    assert sum(ms.values()) <= 1e3 * t["gpu_s"] * 1.05
