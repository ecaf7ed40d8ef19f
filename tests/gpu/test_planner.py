"""What a pass captures and where it keeps it, on the real wgpu device: the planner's capture
policy, scratch regions, streamed passes and the unembedding in token chunks (labkit.gpu.planner,
gpu/scratch.py, gpu/chunked_logits.py, gpu/readback.py).

- positions / names globs / layers cut what a pass captures, and a cut capture holds the same
  numbers as the full one;
- a capture set larger than one buffer is split across staging buffers;
- a buffer over the device's limit is a typed BufferLimitError (a GpuLimitError) that says
  what to capture instead, raised before any GPU work (a 2048-token Gemma prompt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import labkit
from labkit.errors import BufferLimitError, GpuLimitError, InvalidArgumentError, PromptTooLongError, UnknownStageError
from labkit.gpu.dispatch import encode
from labkit.gpu.pass_request import PassRequest
from labkit.gpu.readback import Readback

IDS = [1, 5, 9, 7, 3, 2, 11, 4, 8, 6, 10]


def pass_of(lab, **kw):
    """The executor's own result of a pass of IDS (its plans and regions), on a fresh cache."""
    ex = lab.executor
    return ex.run_pass(PassRequest(IDS, **kw), ex.new_state(len(IDS)))


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
    res = lab.executor.run_pass(PassRequest(ids, names=("logits",)), lab.executor.new_state(T))
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
lab = labkit.open(path, memory="6GB")  # its own budget: the suite's other worker moves what is free
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
