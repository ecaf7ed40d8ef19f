"""Blind cases: a hidden faulty variant, its symptoms only; the learner names the stage and family.

Every faulty variant of both models is played: its symptoms must not name it, the worked answer
(the first divergence, in the prompt pass or its decode step) must pass the check, and a wrong
family or stage must not. A fault that shows nothing on the prompt is passed over, never asked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.casebook.blind import BLIND_PROMPT, blind_case, blind_case_of, blind_cases, candidates
from labkit.ops.registry import is_faulty

pytestmark = pytest.mark.slow
# faults that cannot show on the blind prompt, and why (each checked below to show nothing)
SILENT = {
    ("smollm2-135m", "rope", "normal_pairs"): "SmolLM2 is a llama: its rope already pairs (2i, 2i+1)",
    ("gemma3-270m", "rope", "neox_pairs"): "Gemma 3 is neox-style: its rope already pairs halves (i, i + d/2)",
    **{
        (model, "rope", "yarn_uncancelled"): "no YaRN scaling: the rotation's magnitude is 1 either way"
        for model in ("smollm2-135m", "gemma3-270m")
    },
    ("smollm2-135m", "rmsnorm", "eps_outside"): "eps is small beside SmolLM2's mean squares (norm-cascade's C)",
    ("smollm2-135m", "softmax", "no_max_sub"): "the scores of six tokens are far from exp's overflow",
    ("smollm2-135m", "softmax", "masked_nan"): "no row of a causal prompt pass has every key masked",
    ("gemma3-270m", "softmax", "no_max_sub"): "the scores of six tokens are far from exp's overflow",
    ("gemma3-270m", "softmax", "masked_nan"): "no row of a causal prompt pass has every key masked",
    ("smollm2-135m", "attn_scores", "window_off_by_one"): "SmolLM2 has no sliding window",
    ("gemma3-270m", "attn_scores", "window_off_by_one"): "six tokens are far inside Gemma's 512-token window",
    **{
        (model, "attn_scores", fault): "a prompt pass and its decode step run their own kernels: only a micro-batch "
        "after the first shows it (labkit.paths)"
        for model in ("smollm2-135m", "gemma3-270m")
        for fault in ("chunk_mask_from_zero", "window_from_chunk_start")
    },  # fmt: skip
    **{
        (model, "rope", "positions_restart"): "a prompt pass starts at position 0 and its decode step is one token: "
        "only a micro-batch after the first shows it (labkit.paths)"
        for model in ("smollm2-135m", "gemma3-270m")
    },
    **{
        (model, "attn_workgroups", "streaming_count"): "harmless: the tiled tier's extra workgroups find no head and "
        "return (000, phase 2), and the default CPU tier is not fused"
        for model in ("smollm2-135m", "gemma3-270m")
    },
}


@pytest.mark.parametrize("real_lab", ["smollm2-135m", "gemma3-270m"], indirect=True)
def test_every_faulty_variant_plays_as_a_blind_case(real_lab):
    lab = real_lab
    played = []
    cases = blind_cases(lab)
    assert list(cases) == candidates(lab)
    for (family, variant), case in cases.items():
        assert is_faulty(family, variant)
        if (lab.name, family, variant) in SILENT:
            assert case is None, f"{family}={variant} shows on {lab.name}: {case.reveal()}"
            continue
        assert case is not None, f"{family}={variant} shows nothing on {lab.name}"
        text = case.text()
        assert variant not in text and f"{family}=" not in text, text
        a = case.reveal()
        assert (a.family, a.variant) == (family, variant)
        assert case.check(a.stage, a.family).passed
        assert not case.check(a.stage, "matmul_q8_0" if family != "matmul_q8_0" else "rope").passed
        assert not case.check("embed", a.family).passed
        played.append(f"{family}={variant}")
    assert len(played) >= 4, played
    assert cases[("kv_sequence", "previous_sequence")].reveal().where == "prompt in a batch of 3"
    assert lab.selected == {}, "the lab's selection is put back"


def test_a_seed_draws_a_case_and_names_what_it_passed_over(smollm):
    case = blind_case("smollm2-135m", seed=1, lab=smollm)
    assert case.prompt == BLIND_PROMPT and case.seed == 1
    for over in case.passed_over:
        family, variant = over.split("=")
        assert (smollm.name, family, variant) in SILENT
    a = case.reveal()  # the drawn case is its variant's own case (the rng draws the same for a seed)
    assert blind_case_of(smollm, a.family, a.variant).reveal() == a
    _, shown, right = case.session()  # what `labkit case --blind` prints with no answer
    assert "Which stage first parts from the reference" in shown and "--answer STAGE FAMILY" in shown
    assert a.variant not in shown and "worked answer" not in shown and right


def test_the_cli_plays_a_blind_case():
    """Two CLI runs: a wrong answer with the worked one revealed (exit 1), then the right answer
    (exit 0). The plain question's session text is checked in process, above."""
    base = [sys.executable, "-m", "labkit.cli", "case", "--blind", "--model", "smollm2-135m", "--seed", "2"]
    wrong = subprocess.run(base + ["--answer", "embed", "rmsnorm", "--reveal", "--json"],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert wrong.returncode == 1, wrong.stderr[-1500:]
    worked = json.loads(wrong.stdout)
    a, verdict = worked["answer"], worked["check"]
    assert not verdict["passed"] and "'embed' ✗" in verdict["observed"], verdict
    right = subprocess.run(base + ["--answer", a["stage"], a["family"]], capture_output=True, text=True, timeout=600)
    assert right.returncode == 0 and "✓ right" in right.stdout, right.stdout[-800:]
    assert "Which stage first parts from the reference" in right.stdout and a["variant"] not in right.stdout
