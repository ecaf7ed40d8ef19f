"""Captures that scale, cached plans, and labs that run for a long time, on the real wgpu device.

- positions / names globs / layers cut what a pass captures, and a cut capture holds the same
  numbers as the full one;
- a capture set larger than one buffer is split across staging buffers;
- a buffer over the device's limit is a typed BufferLimitError (a GpuLimitError) that says
  what to capture instead, raised before any GPU work (a 2048-token Gemma prompt);
- generate's cached plans create no GPU objects once warm, and leak no state: a decode after
  another prompt, and a pass after a faulty variant, are bit-identical to a fresh lab's.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import wgpu

import labkit
from labkit.errors import BufferLimitError, GpuLimitError, InvalidArgumentError, PromptTooLongError, UnknownStageError
from labkit.gpu.dispatch import encode
from labkit.gpu.readback import Readback
from labkit.gpu.reuse import Reuse
from labkit.ops.registry import kernel_source

IDS = [1, 5, 9, 7, 3, 2, 11, 4, 8, 6, 10]


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_buffers() -> int:
    gc.collect()
    return wgpu.diagnostics.object_counts.get_dict()["Buffer"]["count"]


def pass_of(lab, **kw):
    """The executor's own result of a pass of IDS (its plans and regions), on a fresh cache."""
    ex = lab.executor
    return ex.run_pass(IDS, ex.new_cache(len(IDS)), **kw)


@pytest.fixture(scope="module")
def lab(tiny_model):
    return labkit.open(tiny_model("gemma3", "Q8_0"))


def test_positions_cut_rows_and_keep_values(lab):
    full = lab.run(IDS)
    last = lab.run(IDS, positions="last")
    for name, arr in last.captures.items():
        assert last.positions[name] == (len(IDS) - 1,), name
        want = full[name][:, -1:] if arr.ndim == 3 and name.endswith(("attn_scores", "attn_probs")) else full[name][-1:]
        if name == "logits":  # computed for the last position only: the decode driver, not the tiled one
            assert arr.shape == (1, lab.config.vocab_size)
            np.testing.assert_allclose(arr, want, rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            assert arr.tobytes() == want.tobytes(), f"{name}: the cut rows differ from the full pass's"
    cut = lab.run(IDS, positions=slice(2, 9, 3))
    assert cut.positions["blk.0.q"] == (2, 5, 8)
    assert cut["blk.0.q"].tobytes() == full["blk.0.q"][[2, 5, 8]].tobytes()
    assert cut["blk.1.attn_probs"].tobytes() == full["blk.1.attn_probs"][:, [2, 5, 8]].tobytes()
    np.testing.assert_array_equal(cut.at("blk.0.q", 5), full.at("blk.0.q", 5))
    with pytest.raises(UnknownStageError, match="holds positions"):
        cut.at("blk.0.q", 3)
    assert lab.run(IDS, positions=[-1, 0])["embed"].tobytes() == full["embed"][[0, -1]].tobytes()
    for bad in ("first", 99, slice(50, 60)):
        with pytest.raises(InvalidArgumentError):
            lab.run(IDS, positions=bad)


def test_names_globs_and_layers(lab):
    run = lab.run(IDS, names=["blk.*.attn_out", "logits"])
    n = lab.config.n_layers
    assert sorted(run.captures) == sorted([f"blk.{L}.attn_out" for L in range(n)] + ["logits"])
    run = lab.run(IDS, layers=[1])
    assert {k for k in run.captures if k.startswith("blk.")} == {s for s in lab.stages if s.startswith("blk.1.")}
    assert {"embed", "output_norm", "logits"} <= set(run.captures)
    run = lab.run(IDS, names="blk.*.attn_probs", layers=[0])
    assert list(run.captures) == ["blk.0.attn_probs"]
    with pytest.raises(UnknownStageError, match="matching no stage"):
        lab.run(IDS, names=["blk.*.nope"])
    with pytest.raises(UnknownStageError, match="no layer 7"):
        lab.run(IDS, layers=[7])


def test_uncaptured_stages_share_scratch_regions(lab):
    """A narrowed capture gives the stages it leaves out scratch regions, recycled once their last
    reader is recorded: the captured values are bit-identical to a full pass's, the pass holds far
    fewer buffers, and a variant switch after it re-runs the whole pass, correctly."""
    full = lab.run(IDS)
    few = lab.run(IDS, names=["blk.1.attn_out", "output_norm"])
    for name in few.captures:
        assert few[name].tobytes() == full[name].tobytes(), name
    assert lab._last_pass is None  # nothing to re-run from: its buffers are freed with it
    res = pass_of(lab, names=["blk.1.attn_out", "output_norm"])
    assert not res.reusable
    own = {p.out.buffer for p in res.plans if not p.skipped and not p.stage.kv_write}
    assert len(own) < len(lab.graph) // 3, f"{len(own)} buffers for {len(lab.graph)} stages"
    kept = {p.out.buffer for p in res.plans if p.stage.name in few.captures}
    assert len(kept) == 2 and not kept & {p.out.buffer for p in res.plans if p.stage.name not in few.captures}
    lab.use("blk.1.rope", "normal_pairs")
    try:
        switched = lab.run(IDS, names=["blk.1.attn_out", "output_norm"])
        assert switched.timings["recomputed_from"] == "embed"
        want = lab.run(IDS)  # a full pass under the same switch
        assert switched["output_norm"].tobytes() == want["output_norm"].tobytes()
        assert switched["output_norm"].tobytes() != few["output_norm"].tobytes()
    finally:
        lab.use("blk.1.rope", "default")


def test_long_pass_streams_its_captures_segment_by_segment(lab, monkeypatch):
    """A pass of STREAM_MIN_TOKENS or more puts every region in scratch and reads its captures back
    segment by segment (here a 11-token pass, 4 KiB segments): every capture is bit-identical to a
    pass that keeps a region per stage, with per-stage timestamps, and positions still cut rows."""
    from labkit.gpu import scratch

    lab.forget_last_pass()  # a whole pass, not a re-run from an earlier test's switch
    full = lab.run(IDS)
    monkeypatch.setattr(scratch, "STREAM_MIN_TOKENS", len(IDS))
    monkeypatch.setattr(scratch, "SEGMENT_BYTES", 4096)
    streamed = lab.run(IDS)
    res = pass_of(lab)
    ends = sum(p.segment_end for p in res.plans)
    assert not res.reusable and ends > 5, ends
    assert streamed.captures.keys() == full.captures.keys()
    for name, arr in full.captures.items():
        assert streamed[name].tobytes() == arr.tobytes(), name
    assert set(streamed.timings["stage_ms"]) == set(full.timings["stage_ms"])
    buffers = {p.out.buffer for p in res.plans if not p.stage.kv_write}
    assert len(buffers) < len(res.plans) // 2, f"{len(buffers)} buffers for {len(res.plans)} stages"
    cut = lab.run(IDS, positions="last", names=["blk.*.attn_probs", "logits"])
    assert cut["blk.1.attn_probs"].tobytes() == full["blk.1.attn_probs"][:, -1:].tobytes()


@pytest.mark.parametrize("T", [37, 33])
def test_long_pass_reads_logits_in_token_chunks(lab, monkeypatch, T):
    """A streamed pass computes and reads its logits in token chunks over one region (here 16-token
    chunks; at 33 tokens the last token joins the chunk before it): bit-identical to a pass that
    holds all logits, with positions cut across chunk edges and a chunk nothing is read from."""
    from labkit.gpu import chunked_logits, scratch

    ids = [1 + (7 * i) % (lab.config.vocab_size - 1) for i in range(T)]
    lab.forget_last_pass()
    full = lab.run(ids, names=["logits"])
    monkeypatch.setattr(scratch, "STREAM_MIN_TOKENS", 16)
    monkeypatch.setattr(chunked_logits, "CHUNK_BYTES", 1)
    res = lab.executor.run_pass(ids, lab.executor.new_cache(T), names=["logits"])
    assert [(c.t0, c.n) for c in res.plans[-1].chunks] == (
        [(0, 16), (16, 16), (32, 5)] if T == 37 else [(0, 16), (16, 17)]
    )
    assert res.plans[-1].out.shape[0] == (16 if T == 37 else 17)
    assert res.captures["logits"].tobytes() == full["logits"].tobytes()
    for positions in (slice(10, 20), [1, T - 1], [17]):
        cut = lab.run(ids, names=["logits"], positions=positions)
        rows = list(range(T))[positions] if isinstance(positions, slice) else positions
        assert cut.positions["logits"] == tuple(rows)
        assert cut["logits"].tobytes() == full["logits"][rows].tobytes(), positions


def test_heads_cut_attention_maps_and_keep_values(lab):
    """heads=[...] reads back only those heads of every attention map; the rest of the pass is the
    same, a head is looked up by its number, and compare meets a full run on the heads both hold."""
    H = lab.config.n_heads
    assert H >= 2, "the tiny gemma3 needs two heads for this test"
    full = lab.run(IDS)
    cut = lab.run(IDS, heads=[H - 1], positions=slice(3, 8))
    for name, arr in cut.captures.items():
        if name.endswith(("attn_scores", "attn_probs")):
            assert cut.heads[name] == (H - 1,) and arr.shape[0] == 1, name
            assert arr.tobytes() == full[name][[H - 1]][:, 3:8].tobytes(), name
        else:
            assert name not in cut.heads and arr.tobytes() == full[name][3:8].tobytes(), name
    np.testing.assert_array_equal(cut.head("blk.1.attn_probs", H - 1), full["blk.1.attn_probs"][H - 1, 3:8])
    with pytest.raises(UnknownStageError, match="holds heads"):
        cut.head("blk.1.attn_probs", 0)
    cmp = labkit.compare(cut, full)
    assert cmp.passed and "blk.0.attn_probs" in {r.stage for r in cmp.rows}
    assert lab.run(IDS, heads=-1).heads["blk.0.attn_scores"] == (H - 1,)
    for bad in ([H], [], -H - 1):
        with pytest.raises(InvalidArgumentError, match="attention heads"):
            lab.run(IDS, heads=bad)


def test_capture_policy_is_one_argument(lab):
    """capture= takes a labkit.Capture, a dict of its fields, or names; logits="last" computes the
    last position's logits only, every other stage keeping every position."""
    full = lab.run(IDS)
    run = lab.run(IDS, capture=labkit.Capture(names=["blk.0.*", "logits"], heads=[0], logits="last"))
    assert set(run.captures) == {s for s in lab.stages if s.startswith("blk.0.")} | {"logits"}
    assert run["logits"].shape == (1, lab.config.vocab_size) and run.rows("logits") == (len(IDS) - 1,)
    np.testing.assert_allclose(run["logits"][0], full["logits"][-1], rtol=1e-5, atol=1e-5)
    assert run["blk.0.q"].tobytes() == full["blk.0.q"].tobytes()
    assert run["blk.0.attn_probs"].tobytes() == full["blk.0.attn_probs"][[0]].tobytes()
    assert list(lab.run(IDS, capture="blk.1.attn_out").captures) == ["blk.1.attn_out"]
    by_dict = lab.run(IDS, capture={"layers": [0], "positions": "last"})
    assert by_dict.rows("blk.0.q") == (len(IDS) - 1,) and "blk.1.q" not in by_dict
    with pytest.raises(InvalidArgumentError, match="not both"):
        lab.run(IDS, capture=["logits"], names=["embed"])
    with pytest.raises(InvalidArgumentError, match="unknown key"):
        lab.run(IDS, capture={"stages": ["embed"]})
    with pytest.raises(InvalidArgumentError, match='"all" or "last"'):
        labkit.Capture(logits="first")


def test_logits_not_captured_are_computed_for_the_last_position_only(lab):
    """Nothing reads the other positions' logits, so the unembedding runs for one row."""
    run = lab.run(IDS, names=["output_norm"])
    assert list(run.captures) == ["output_norm"]
    plans = pass_of(lab, names=["output_norm"]).plans
    assert plans[-1].out.shape[0] == 1, plans[-1].out.shape


class SmallBuffers:
    """The real device, pretending its max-buffer-size is `limit` (to split a small capture)."""

    def __init__(self, device, limit: int):
        self._device, self.limits = device, dict(device.limits, **{"max-buffer-size": limit})

    def __getattr__(self, name):
        return getattr(self._device, name)


def test_capture_split_across_staging_buffers(lab):
    ex = lab.executor
    plans = ex.plan(IDS, ex.new_cache(len(IDS)))
    wgpu_dev = ex.device
    enc = wgpu_dev.create_command_encoder()
    encode(enc, [d for p in plans for d in p.dispatches])
    whole, split = Readback(wgpu_dev, plans, len(IDS)), Readback(SmallBuffers(wgpu_dev, 4096), plans, len(IDS))
    whole.record(enc)
    split.record(enc)
    wgpu_dev.queue.submit([enc.finish()])
    assert len(whole.sizes) == 1 and len(split.sizes) > 5 and max(split.sizes) <= 4096, split.sizes
    a, b = whole.read()[0], split.read()[0]
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


LONG_LOGITS = """
import json, sys
import numpy as np
from gguf.quants import dequantize as gguf_dequantize
import labkit
from labkit.model.shaped import Shape, write_shaped_model
# one llama layer 256 wide, with Gemma 3's vocabulary of 262144: the unembedding is what is tested
path = write_shaped_model(sys.argv[1], Shape("llama", 1, 256, 4, 2, 64, 512, 262144, tied=True))
lab = labkit.open(path)
ids = [1 + i % 5000 for i in range(2048)]
run = lab.run(ids, names=["output_norm", "logits"])
logits, hidden = run["logits"], run["output_norm"]
st = lab.graph[-1]
t = lab.gguf.tensors[st.weight]
w = gguf_dequantize(np.asarray(lab.gguf.raw(st.weight)), t.ggml_type).reshape(t.n_rows, t.n_cols)
rows = {}
for row in (0, 63, 64, 1000, 2047):
    want = (w @ hidden[row]).astype(np.float64)  # float32: no float64 copy of the table
    rows[row] = [float(np.abs(logits[row] - want).max()), float(np.abs(want).max())]
print(json.dumps({"shape": list(logits.shape), "finite": bool(np.isfinite(logits).all()), "rows": rows}))
"""


def test_long_prompt_runs_with_its_logits_in_chunks(tmp_path):
    """2048 tokens over Gemma 3's vocabulary: [2048, 262144] f32 logits are 2 GiB, one byte over
    lavapipe's max-buffer-size. The streamed pass computes and reads them 64 tokens at a time, so
    they never need one buffer; rows at chunk edges are output_norm · Wᵀ (W from gguf.quants,
    numpy). A one-layer file of that vocabulary (labkit.model.shaped), not Gemma 3 270M's 18
    layers: the unembedding is what is tested, and 2048 tokens through 18 layers took 170 s of
    the suite. In a process of its own: its 2 GiB of logits are not the suite's to hold."""
    script = [sys.executable, "-c", LONG_LOGITS, str(tmp_path / "vocab262144.gguf")]
    p = subprocess.run(script, capture_output=True, text=True, timeout=600, env={**os.environ, "LABKIT_PROGRESS": "0"})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["shape"] == [2048, 262144] and got["finite"]
    for row, (err, scale) in got["rows"].items():
        assert err < 2e-3 * scale, f"row {row}: max |diff| {err:.3g}"


def test_longer_gemma_prompt_says_what_to_capture():
    """4096 tokens of Gemma 3 with every stage captured: each [4, 4096, 4096] attention map takes 256
    MiB, over lavapipe's 128 MiB storage binding, and its kernels bind it whole. Raised while
    planning, before any GPU work; typed both ways, and it says what to do instead. (A budget
    large enough that the memory plan keeps every stage: the device's limit is what is tested.)"""
    lab = labkit.open("gemma3-270m", memory="1TB")
    ids = [2] + [1000 + i % 5000 for i in range(4095)]
    with pytest.raises(BufferLimitError) as e:
        lab.run(ids)
    assert isinstance(e.value, GpuLimitError) and isinstance(e.value, PromptTooLongError)
    msg = str(e.value)
    assert "attn_scores" in msg and "256.0 MiB" in msg and 'lab.use("attn_ctx", "tiled")' in msg, msg


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
