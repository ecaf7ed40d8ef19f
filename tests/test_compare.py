"""compare (labkit.compare): runs meet on the stages both captured, and say what they could not compare."""

from __future__ import annotations

import numpy as np
import pytest

import labkit


def test_compare_with_nothing_in_common_raises_and_a_partial_overlap_lists_the_rest():
    from labkit.captures import Run
    from labkit.errors import NoCommonStagesError

    x = np.ones((2, 4), np.float32)
    a = Run("m", "gpu", [1, 2], ["embed", "logits"], {"embed": x})
    b = Run("m", "reference", [1, 2], ["embed", "logits"], {"logits": x})
    with pytest.raises(NoCommonStagesError, match="no captured stage in common"):
        labkit.compare(a, b)
    b.captures["embed"] = x
    cmp = labkit.compare(a, b)
    assert cmp.passed and cmp.missing == ["logits"]
    assert "not compared: logits" in cmp.table() and "not compared" not in cmp.table().replace(
        "not compared: logits", ""
    )


def test_logits_agreement_is_kl_of_the_reference_from_the_run_and_top1():
    """KL(reference ‖ run) per position, as llama.cpp's --kl-divergence and scipy's entropy(p, q)
    compute it, and whether both put the same token first."""
    from scipy.stats import entropy

    from labkit.logits_agreement import logits_agreement

    rng = np.random.default_rng(11)
    ref = rng.standard_normal((5, 300)) * 3
    run = ref + rng.standard_normal((5, 300)) * 0.001
    run[2, np.argmax(ref[2])] -= 50.0  # position 2 ranks another token first
    got = logits_agreement(run, ref, (3, 4, 5, 6, 7))

    def probs(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    want = [entropy(p, q) for p, q in zip(probs(ref), probs(run), strict=True)]
    assert np.allclose(got.kl, want, rtol=1e-9, atol=1e-15) and got.positions == (3, 4, 5, 6, 7)
    assert got.same_top1 == (True, True, False, True, True) and got.top1_agreement == 0.8
    assert "the same top token at 4 of 5 positions" in got.text()
    bad = run.copy()
    bad[1, 7] = np.nan
    assert logits_agreement(bad, ref, (0, 1, 2, 3, 4)) is None  # the NMSE row names the NaN


def test_a_comparison_carries_the_logits_agreement(tiny_model):
    lab = labkit.open(tiny_model("llama"))
    ids = [1, 5, 9, 33, 2]
    ref = lab.reference(ids)
    clean = labkit.compare(lab.run(ids), ref)
    assert clean.logits is not None and clean.logits.max_kl < 1e-6 and clean.logits.top1_agreement == 1.0
    lab.use("rmsnorm", "scale_clamp")
    try:
        broken = labkit.compare(lab.run(ids), ref)
    finally:
        lab.use("rmsnorm", "default")
    assert broken.logits.mean_kl > 100 * clean.logits.mean_kl
    assert broken.to_dict()["logits"]["top1_agreement"] == broken.logits.top1_agreement
