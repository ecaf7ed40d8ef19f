"""Batches of sequences (labkit.batch): each sequence of a packed pass holds what its own one-shot pass
holds, on the reference to 1e-12 and on the GPU inside the f32 band, on every kind of layer (sliding
windows, experts, latent attention, recurrent states); a batch decodes as its sequences decode alone;
bad batches are refused before any work."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.bench import BatchFigures, BenchReport
from labkit.errors import InvalidArgumentError, MemoryBudgetError, PromptTooLongError
from labkit.model.batch_stages import per_sequence
from labkit.model.reference import KVCache

IDS = [(7 * i + 3) % 200 + 1 for i in range(19)]
# other lengths and tokens; one token alone; the longest not first, so later rows sit past shorter ones
SEQS = [IDS[:5], IDS[3:], IDS[:1], IDS[::-1][:9]]


def _rel(a, b) -> float:
    x = np.nan_to_num(np.asarray(a, np.float64), neginf=0.0)
    y = np.nan_to_num(np.asarray(b, np.float64), neginf=0.0)
    assert x.shape == y.shape
    return float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-300))


@pytest.mark.parametrize("model", ["gemma3", "tiny-qwen3moe", "tiny-deepseek2", "tiny-granitehybrid"])
def test_each_sequence_of_a_batch_holds_its_own_pass(model, tiny_model):
    """gemma3's window is 4 tokens (crossed by every sequence but one), the MoE gathers tokens of every
    sequence for its experts, deepseek2 caches a latent, granitehybrid carries a recurrent state per sequence."""
    lab = labkit.open(tiny_model("gemma3", "Q8_0") if model == "gemma3" else model)
    ref_batch, gpu_batch = lab.run_batch(SEQS, engine="reference"), lab.run_batch(SEQS)
    assert [r.path for r in gpu_batch] == ["batch=4"] * 4 and [r.tokens for r in gpu_batch] == SEQS
    for seq, ref_run, gpu_run in zip(SEQS, ref_batch, gpu_batch):
        alone = lab.reference(seq)
        assert set(ref_run.captures) == set(alone.captures) == set(gpu_run.captures)
        assert max(_rel(ref_run[n], alone[n]) for n in alone.captures) < 1e-12
        assert labkit.compare(gpu_run, alone).first_divergence is None


def test_the_batch_rule_runs_per_sequence_only_what_mixes_tokens(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    kinds = {n.split(".", 2)[-1] for n in per_sequence(lab.graph)}
    assert kinds == {"q_rope", "k_rope", "v", "attn_scores", "attn_probs", "attn_ctx"}  # v writes the cache
    hybrid = {n.split(".", 2)[-1] for n in per_sequence(labkit.open("tiny-granitehybrid").graph)}
    assert {"ssm_conv", "ssm_scan", "conv_state", "scan_state"} <= hybrid and "ffn_up" not in hybrid


def test_a_reference_batch_continues_each_sequence_cache(tiny_model):
    """A decode step of every sequence at once, each at its own position, as each alone."""
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    eng = lab.reference_engine
    caches = [KVCache() for _ in SEQS]
    eng.forward_batch(SEQS, caches, [])
    step = eng.forward_batch([[5]] * len(SEQS), caches)
    assert [c.n_past for c in caches] == [len(s) + 1 for s in SEQS]
    for seq, got in zip(SEQS, step):
        cache = KVCache()
        eng.forward(seq, cache, [])
        alone = eng.forward([5], cache)
        assert got["blk.1.attn_probs"].shape == alone["blk.1.attn_probs"].shape == (4, 1, len(seq) + 1)
        assert max(_rel(got[n], alone[n]) for n in alone) < 1e-12


def test_a_batch_decodes_as_its_sequences_alone(smollm):
    """Continuous batching, greedy: each sequence's tokens are its own generate's; the batch step's
    time and dispatches are reported."""
    prompts = ["The quick brown fox", "Hello there, how are you doing today?", "A"]
    out = smollm.generate_batch(prompts, max_new_tokens=6)
    assert out.ids == [smollm.generate(p, max_new_tokens=6).ids for p in prompts]
    assert out.timings["steps"] == 5 and out.timings["decode_s_per_step"] > 0 and out.timings["dispatches"] > 0
    ref = smollm.generate_batch(prompts[:2], max_new_tokens=3, engine="reference")
    assert ref.ids == [p[:3] for p in out.ids[:2]]
    assert out.texts[0] == smollm.detokenize(out.ids[0])


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_batch_decode_step_is_compiled_and_gives_the_planned_steps_bits(tiny_model, arch):
    """One token for each sequence, each at its own position: the batch's compiled step (its words moved by
    each sequence's own position, its matmuls fused with the adds and activations after them, as a single
    step's) against the same steps planned afresh and unfused (timestamps plan every pass)."""
    from labkit.gpu.pass_request import BatchState

    lab = labkit.open(tiny_model(arch, "Q8_0"))
    ex = lab.executor
    compiled, planned = (BatchState([ex.new_state(32) for _ in SEQS]) for _ in range(2))
    for batch in (compiled, planned):
        ex.run_batch_pass(SEQS, batch, [])
    for token in (9, 17, 33, 60):  # past the window of 4 and across the keys' power-of-two rounding
        a = ex.run_batch_pass([[token]] * len(SEQS), compiled, ["logits", "blk.1.attn_ctx"])
        b = ex.run_batch_pass([[token]] * len(SEQS), planned, ["logits", "blk.1.attn_ctx"], timestamps=True)
        assert a.timings["compiled"] == 1.0 and b.timings["compiled"] == 0.0
        for got, want in zip(a.captures, b.captures):
            assert all(np.array_equal(got[n], want[n]) for n in want)
    assert [kv.n_past for kv in (s.kv for s in compiled.states)] == [len(s) + 4 for s in SEQS]
    fused = {n.split(".", 2)[-1] for p in compiled.step.plans for n in p.also_writes}
    assert fused == ({"ffn_act"} if arch == "gemma3" else {"resid_mid", "resid_out", "ffn_act"})


def test_batch_path_is_exact_on_the_reference_and_in_band_on_the_gpu(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    report = labkit.paths(lab, IDS, ["batch=4"], engines=("gpu", "reference"))
    assert [(c.path, c.engine) for c in report.checks] == [("batch=4", "gpu"), ("batch=4", "reference")]
    assert all(c.in_band for c in report.checks), report.table()
    assert next(c for c in report.checks if c.engine == "reference").worst_nmse < 1e-20


def test_llama_cpp_computes_the_same_batch(smollm):
    """llama.cpp's own batch (sequence ids over one unified cache, one micro-batch): each sequence's tensors
    are its own one-shot llama.cpp pass's, within llama.cpp's band, and no sequence sees another's keys (the
    oracle checks its masks); the GPU's batch path matches llama.cpp computing the same batch."""
    seqs = [smollm.tokenize(t) for t in ("The quick brown fox", "Hello there, how are you doing today?", "A cat")]
    runs = smollm.run_batch(seqs, engine="llamacpp")
    assert [r.engine for r in runs] == ["llamacpp"] * 3 and runs[1]["blk.3.attn_probs"].shape[1:] == (9, 9)
    for seq, run in zip(seqs, runs):
        assert labkit.compare(run, smollm.oracle(seq)).first_divergence is None
    report = labkit.paths(smollm, seqs[1], ["batch=3"], engines=("gpu", "llamacpp"))
    gpu = next(c for c in report.checks if c.engine == "gpu")
    assert gpu.in_band and gpu.against_llamacpp is None, report.table()


def test_a_batch_fault_is_localized_on_the_batch_path_and_invisible_alone():
    """kv_sequence=previous_sequence bound to layer 1: each sequence after the first reads the cache of the one
    packed before it. One-shot and decode passes have no other sequence; the batch departs at that layer's
    first reader of the cache, for every sequence but the first."""
    lab = labkit.open("tiny-qwen3moe").use("blk.1.kv_sequence", "previous_sequence")
    assert labkit.compare(lab.run(IDS), lab.reference(IDS)).first_divergence is None
    runs = lab.run_batch(SEQS)
    found = [labkit.compare(run, lab.reference(seq)).first_divergence for seq, run in zip(SEQS, runs)]
    assert found == [None] + ["blk.1.attn_scores"] * 3
    report = labkit.paths(lab, IDS, ["batch=4"], engines=("gpu",))
    assert report.checks[0].first_divergence == "blk.1.attn_scores"


def test_a_kernel_chosen_by_batch_size_is_in_band_but_not_batch_invariant():
    """rmsnorm=by_batch_size picks its driver by the pass's token count (19 alone, 70 packed): correct on both,
    and the batch path says which stage first stops being bitwise the one-shot pass's, and by how much."""
    lab = labkit.open("tiny-qwen3moe")
    clean = labkit.paths(lab, IDS, ["batch=4"], engines=("gpu",))
    lab.use("rmsnorm", "by_batch_size")
    varied = labkit.paths(lab, IDS, ["batch=4"], engines=("gpu",))
    assert clean.checks[0].first_difference is None and "attn_norm: differs" not in clean.invariance()
    check = varied.checks[0]
    assert check.in_band and check.first_difference == "blk.0.attn_norm"
    norm = next(s for s in check.stages if s.stage == "blk.0.attn_norm")
    assert norm.inputs_bitwise and 0 < norm.max_abs < 1e-5
    assert "attn_norm: differs on batch=4" in varied.invariance()


def test_bad_batches_are_refused_before_any_work(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    for bad in ([], "one prompt"):
        with pytest.raises(InvalidArgumentError, match="a batch is a non-empty list"):
            lab.run_batch(bad)
    with pytest.raises(PromptTooLongError, match="empty"):
        lab.run_batch([[1, 2], []])
    with pytest.raises(PromptTooLongError):  # one sequence over the context, before any pass
        lab.generate_batch([[1, 2], IDS * (lab.config.context_length // len(IDS) + 1)], max_new_tokens=4)
    with pytest.raises(InvalidArgumentError, match="engine"):
        lab.run_batch(SEQS, engine="vllm")
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        lab.generate_batch(SEQS, max_new_tokens=-1)
    with pytest.raises(InvalidArgumentError, match="generate_batch engine 'llamacpp'"):
        lab.generate_batch(SEQS, max_new_tokens=2, engine="llamacpp")
    small = labkit.open(tiny_model("gemma3", "Q8_0"), memory="40MB")
    with pytest.raises(MemoryBudgetError):  # every sequence's cache and the packed captures are planned
        small.run_batch([IDS * 8] * 16, names=["blk.*.attn_probs"])


def test_bench_batch_figures_round_trip():
    fig = BatchFigures(4, step_s=0.3, one_step_s=0.1, batch1_step_s=0.12, dispatches=1356)
    report = BenchReport("m", "lavapipe", 3, {}, batch=fig)
    assert report.ratios()["gpu batch of 4 step / one sequence's step"] == pytest.approx(2.5)  # the same loop's
    again = BenchReport.from_dict(report.to_dict())
    assert again.batch == fig and "a batch of 4" in again.table()
