"""The float64 reference against llama.cpp's golden files (written by scripts/make_golden.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REAL_MODELS, _open_cached, golden


def check_against_golden(logits: np.ndarray, entry: dict, tol: float = 0.5, raw_tol: float = 0.75) -> None:
    """Same top-1, top-5 sets overlapping in ≥ 4, top-10 logits within `tol` of llama.cpp's.

    llama.cpp quantizes activations to 8 bits inside its matmuls, which moves all its logits
    together by up to ~0.6 on longer prompts (measured: 0.62 on the 22-token code prompt of
    gemma3). A common shift leaves the softmax unchanged, so `tol` applies once the mean
    offset over the top-10 is removed, and the raw difference must stay within `raw_tol`.
    """
    want_ids = [t["id"] for t in entry["top"]]
    got_ids = list(np.argsort(-logits, kind="stable")[:10])
    text = entry["text"]
    assert got_ids[0] == want_ids[0], f"{text!r}: top-1 {got_ids[0]} != llama.cpp {want_ids[0]}"
    overlap = len(set(got_ids[:5]) & set(want_ids[:5]))
    assert overlap >= 4, f"{text!r}: top-5 overlap {overlap} ({got_ids[:5]} vs {want_ids[:5]})"
    d = np.array([logits[t["id"]] - t["logit"] for t in entry["top"]])
    shape_err = float(np.max(np.abs(d - d.mean())))
    assert shape_err <= tol, f"{text!r}: top-10 logits differ by {shape_err:.3f} > {tol} beyond a shift"
    assert float(np.max(np.abs(d))) <= raw_tol, f"{text!r}: top-10 logit max |diff| {np.abs(d).max():.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL_MODELS)
def test_reference_matches_llamacpp_on_every_golden_prompt(model):
    lab = _open_cached(model)
    for entry in golden(model)["prompts"]:
        run = lab.reference(entry["tokens"], names=["logits"])
        check_against_golden(run.logits(-1), entry)


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL_MODELS)
def test_reference_top3_for_the_sky_prompt(model):
    lab = _open_cached(model)
    run = lab.reference("The color of the sky is", names=["logits"])
    entry = golden(model)["prompts"][0]
    assert run.tokens == entry["tokens"]
    if model == "gemma3-270m":  # smollm2's 3rd and 4th are 0.06 apart in llama.cpp: noise decides
        assert [t.piece for t in run.top(3)] == [" a", " the", " blue"]
    check_against_golden(run.logits(-1), entry, tol=0.5, raw_tol=0.5)


@pytest.mark.slow
def test_reference_greedy_decode_with_cache_matches_full_recompute(smollm):
    """KV-cached decode equals rerunning the whole sequence: the cache path is right."""
    gen = smollm.generate_reference("The color of the sky is", max_new_tokens=4)
    full = smollm.reference(gen.prompt_ids + gen.ids[:-1], names=["logits"])
    assert int(np.argmax(full.logits(-1))) == gen.ids[-1]
    entry = golden("smollm2-135m")["prompts"][0]
    assert gen.ids == entry["greedy"][:4]


def test_reference_stage_names_and_shapes_on_tiny(tiny_model):
    import labkit

    for arch in ("gemma3", "llama", "qwen2"):
        lab = labkit.open(tiny_model(arch, "Q8_0"))
        run = lab.reference([1, 5, 9, 7, 3, 2])
        c = lab.config
        assert run.stages[0] == "embed" and run.stages[-2:] == ["output_norm", "logits"]
        assert run["blk.0.attn_scores"].shape == (c.n_heads, 6, 6)
        assert run["blk.1.q_rope"].shape == (6, c.q_dim)
        assert run["logits"].shape == (6, c.vocab_size)
        assert ("blk.0.q_norm" in run.stages) == (arch == "gemma3")
        probs = run["blk.0.attn_probs"]
        assert np.allclose(probs.sum(-1), 1.0)
        if arch == "gemma3":  # window 4 on layer 0: query 5 cannot see keys 0 and 1
            assert np.all(np.isneginf(run["blk.0.attn_scores"][:, 5, :2]))
            assert np.all(np.isfinite(run["blk.1.attn_scores"][:, 5, :6]))
