"""A prompt in micro-batches (labkit.chunks, `ubatch=`): on the float64 reference it equals the
one-shot pass at every stage to 1e-12 (a sliding window crossed, a recurrent state carried, experts
routed); on the GPU it passes against the reference; captures are put back together as one pass's."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.chunks import chunk_spans, merge_chunks
from labkit.errors import InvalidArgumentError

IDS = [(7 * i + 3) % 200 + 1 for i in range(19)]  # crosses the tiny gemma3's window of 4 several times


def worst_relative(a: labkit.Run, b: labkit.Run) -> float:
    """The largest |a - b| per stage over that stage's largest |b|; masked entries must match."""
    assert set(a.captures) == set(b.captures)
    worst = 0.0
    for name in b.captures:
        x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
        assert x.shape == y.shape, (name, x.shape, y.shape)
        finite = np.isfinite(y)
        assert np.array_equal(np.isfinite(x), finite) and np.array_equal(x[~finite], y[~finite]), name
        if finite.any():
            worst = max(worst, float(np.abs(x[finite] - y[finite]).max() / max(np.abs(y[finite]).max(), 1e-300)))
    return worst


@pytest.fixture(scope="module", params=["gemma3", "tiny-granitehybrid", "tiny-qwen3moe", "tiny-deepseek2"])
def lab(request, tiny_model):
    """A sliding window (tiny gemma3's is 4), a hybrid's recurrent state, a mixture of experts, and DeepSeek's latent
    attention (its cache rows written chunk by chunk: vLLM #26042, MLA with chunked prefill)."""
    return labkit.open(tiny_model("gemma3", "Q8_0") if request.param == "gemma3" else request.param)


@pytest.mark.parametrize("ubatch", [1, 7, 16])
def test_a_chunked_reference_equals_the_one_shot_pass_at_every_stage(lab, ubatch):
    one = lab.reference(IDS)
    chunked = lab.reference(IDS, ubatch=ubatch)
    assert chunked.path == f"ubatch={ubatch}" and one.path == "one-shot"
    assert worst_relative(chunked, one) < 1e-12


def test_a_chunked_gpu_run_passes_against_the_one_shot_reference(lab):
    run = lab.run(IDS, ubatch=7)
    assert run.path == "ubatch=7" and run.timings["passes"] == 3 and run.n_past == 0
    cmp = labkit.compare(run, lab.reference(IDS))
    assert cmp.first_divergence is None, cmp.headline()
    maps = [name for name in run.captures if name.endswith("attn_probs")]  # a hybrid attends in some layers
    assert run["logits"].shape[0] == len(IDS) and run[maps[0]].shape[1:] == (len(IDS), len(IDS))


def test_chunks_are_put_back_as_one_pass():
    """Rows concatenated, attention maps widened with masked keys (-inf scores, 0 probabilities), a
    recurrent state the last pass's."""
    rng = np.random.default_rng(5)
    parts = []
    for start, end in chunk_spans(5, 2):
        T, keys = end - start, end
        parts.append({
            "blk.0.ffn_down": rng.standard_normal((T, 3)),
            "blk.0.attn_scores": rng.standard_normal((2, T, keys)),
            "blk.0.attn_probs": rng.random((2, T, keys)),
            "blk.0.scan_state": rng.standard_normal((1, 4)),
        })  # fmt: skip
    merged = merge_chunks(parts, 5)
    assert np.array_equal(merged["blk.0.ffn_down"], np.concatenate([p["blk.0.ffn_down"] for p in parts]))
    assert np.array_equal(merged["blk.0.scan_state"], parts[-1]["blk.0.scan_state"])
    scores, probs = merged["blk.0.attn_scores"], merged["blk.0.attn_probs"]
    assert scores.shape == probs.shape == (2, 5, 5)
    assert np.array_equal(scores[:, 2:4, :4], parts[1]["blk.0.attn_scores"]) and np.isneginf(scores[:, :2, 2:]).all()
    assert (probs[:, :2, 2:] == 0).all() and (probs[:, 2:4, 4] == 0).all()


@pytest.mark.parametrize("ubatch", [0, -3, 2.5, True, None])
def test_a_micro_batch_must_be_a_positive_count(ubatch):
    with pytest.raises(InvalidArgumentError, match="micro-batch"):
        chunk_spans(10, ubatch)


def test_a_micro_batch_of_zero_is_refused_before_any_work(lab):
    for engine in (lab.run, lab.reference):
        with pytest.raises(InvalidArgumentError, match="ubatch=0"):
            engine(IDS, ubatch=0)
    with pytest.raises(InvalidArgumentError, match="every position"):
        lab.run(IDS, ubatch=4, positions="last")
