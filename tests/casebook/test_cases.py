"""The post-mortem cases: the registry, the report's logic, the shared measurements, and (slow) every
case end to end on its real model, asserting each symptom under the fault and its absence after
the fix, the first divergence at the root cause's stage, and the checklist after the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from notebook_outputs import CASE_REPORTS

import labkit
from labkit.casebook import CaseLabError, CaseReport, Check, UnknownCaseError, cases, get_case, run_case, tools
from labkit.casebook.base import Case

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_DIVERGENCE = {
    "q4k-sign": "blk.0.attn_out",
    "sky-kaw": "blk.0.attn_scores",
    "lm-head-unwritten": "logits",
    "norm-cascade": "blk.0.attn_norm",
    "top-p-order": "sampling",
    "rope-style": "blk.0.q_rope",
    "norm-cascade-bitnet": "blk.0.attn_norm",
    "moe-router": "blk.0.ffn_expert_weights",
    "batch-crosstalk": "blk.0.attn_scores",
}
NAMES = list(EXPECTED_DIVERGENCE)


# ----- registry ------------------------------------------------------------------------------


def test_the_cases_are_registered_in_post_mortem_order():
    assert [c.name for c in cases()] == NAMES
    for c in cases():
        assert get_case(c.name) is c
        assert c.model in labkit.MODELS
        assert c.postmortem in {"000", "001", "002", "003", "004"} or (c.postmortem == "" and c.notes)
        assert c.prompt and c.title and c.lesson and c.story
        assert c.root_cause_stage == EXPECTED_DIVERGENCE[c.name]
        for fn in (c.symptoms, c.checklist, c.reference, c.observe, c.localize):
            assert callable(fn)


def test_each_fix_puts_the_faulted_families_back_on_default():
    for c in cases():
        faulted = set(c.fault) | {f for extra in c.extra_faults for f in extra}
        assert set(c.fix) == faulted, c.name
        assert all(v == "default" for v in c.fix.values()), c.name


def test_every_fault_is_a_registered_faulty_variant():
    from labkit.ops.registry import KERNELS, get_kernel, get_policy
    from labkit.sampling import FAULTY_SAMPLERS

    for c in cases():
        c.prepare()  # norm-cascade registers its own clamp variant
        for extra in [c.fault, *c.extra_faults]:
            for family, name in extra.items():
                if family == "sampling":
                    assert name in FAULTY_SAMPLERS, (c.name, name)
                else:
                    v = get_kernel(family, name) if family in KERNELS else get_policy(family, name)
                    assert v.faulty, (c.name, family, name)


def test_the_post_mortem_files_exist():
    for c in cases():
        if c.postmortem:  # a case of no post-mortem (moe-router, batch-crosstalk) says where it comes from in its notes
            assert c.postmortem_path is not None and c.postmortem_path.name.startswith(c.postmortem)


def test_unknown_case_is_a_typed_error():
    with pytest.raises(UnknownCaseError) as e:
        get_case("no-such-case")
    assert isinstance(e.value, labkit.LabkitError)
    assert "q4k-sign" in str(e.value)
    with pytest.raises(UnknownCaseError):
        run_case("no-such-case")


def test_a_lab_that_does_not_fit_the_case_is_refused():
    with pytest.raises(CaseLabError):
        run_case("lm-head-unwritten", lab=labkit.open("smollm2-135m"))  # needs 4 MiB windows
    with pytest.raises(CaseLabError):
        run_case("top-p-order", lab=labkit.open("gemma3-270m"))  # another model


def test_cases_do_not_import_viz():
    for path in (ROOT / "labkit" / "cases").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+labkit\.viz", text, re.M), path.name


# ----- the report's logic --------------------------------------------------------------------


def _report(symptoms_fixed: bool = False, divergence: str = "x", checklist_fixed: bool = True) -> CaseReport:
    case = Case(
        name="t",
        postmortem="000",
        title="t",
        model="smollm2-135m",
        prompt="p",
        fault={"rope": "normal_pairs"},
        fix={"rope": "default"},
        root_cause_stage="x",
        symptoms=lambda *a: [],
        checklist=lambda *a: [],
        lesson="l",
        reference=lambda lab: None,
        observe=lambda *a: None,
        localize=lambda *a: (None, None),
    )
    return CaseReport(
        case=case,
        symptoms_faulty=[Check("s", "x > 1", "x = 3", True, np.float32(3.0))],
        symptoms_fixed=[Check("s", "x > 1", "x = 0.5", symptoms_fixed, 0.5)],
        first_divergence=divergence,
        expected_divergence="x",
        checklist_faulty=[Check("c", "x < 1", "x = 3", False, np.inf)],
        checklist_fixed=[Check("c", "x < 1", "x = 0.5", checklist_fixed, np.array([0.5]))],
        timings={"total": 1.0},
    )


def test_report_passes_only_when_every_direction_holds():
    assert _report().passed
    assert not _report(symptoms_fixed=True).passed  # a symptom still there after the fix
    assert not _report(divergence="y").passed  # localized elsewhere
    assert not _report(checklist_fixed=False).passed


def test_report_serializes_and_reads():
    r = _report()
    d = json.loads(json.dumps(r.to_dict()))
    assert d["passed"] is True and d["name"] == "t"
    assert d["symptoms"][0]["faulty"]["present"] is True and d["symptoms"][0]["fixed"]["present"] is False
    assert d["checklist"][0]["faulty"]["value"] == "inf"
    text = r.text()
    assert "PASSED" in text and "first divergence: x" in text


# ----- shared measurements -------------------------------------------------------------------


def test_sign_readout_finds_positive_windows_in_a_mixed_vector():
    v = np.array([-1.0, 2, 3, 4, 5, 6, -7, 8, -9, 1])
    sr = tools.sign_readout(v, 5)
    assert sr.positive_windows == [1] and sr.illusion_at == 1
    assert sr.negative_frac == pytest.approx(0.3)


def test_latin_script():
    assert tools.latin_script(" blue") and tools.latin_script(" pół") and tools.latin_script(" 2000.")
    assert not tools.latin_script("のだろう") and not tools.latin_script("మా")


def test_chi_square_accepts_the_exact_sampler_and_rejects_a_lost_tail():
    pytest.importorskip("scipy")
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(3000, 0.3))
    ids = np.arange(3000) + 7
    good = rng.choice(ids, size=4000, p=p)
    assert tools.chi_square(good, ids, p).p > 1e-3
    keep = np.argsort(-p)[:300]  # a sampler that never leaves the 300 best tokens
    q = np.zeros_like(p)
    q[keep] = p[keep] / p[keep].sum()
    lost = rng.choice(ids, size=4000, p=q)
    assert tools.chi_square(lost, ids, p).p < 1e-6
    outside = np.concatenate([good[:-5], [1, 2, 3, 4, 5]])  # ids the distribution does not have
    res = tools.chi_square(outside, ids, p)
    assert res.outside == 5 and res.p < 1e-6


def test_chi2_fallback_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for stat, dof in ((3.0, 1), (150.0, 136), (13091.0, 136), (0.5, 10), (40.0, 20)):
        assert tools._gammaincc(dof / 2, stat / 2) == pytest.approx(
            scipy_stats.chi2.sf(stat, dof), rel=1e-6, abs=1e-300
        )


def test_exact_distribution_is_llama_cpp_order():
    from labkit.casebook.top_p_order import accumulated, exact_distribution
    from labkit.sampling import correct_order

    z = np.random.default_rng(0).normal(size=5000) * 3
    for T, k, p in ((1.0, 0, 0.9), (0.7, 40, 0.95), (1.5, 0, 1.0)):
        a_ids, a_p = exact_distribution(z, T, k, p)
        b_ids, b_p = correct_order(z, T, k, p)
        assert list(a_ids) == list(b_ids) and np.allclose(a_p, b_p)
    assert accumulated("default", z, 1.0).sum() == pytest.approx(1.0)
    assert accumulated("norm_top1000", z, 1.0).sum() > 1.0
    assert accumulated("top_p_before_softmax", z, 1.0).sum() > 1.0


def test_weight_roundtrip_reads_q4k_through_the_kernel(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q4_K"))
    name = tools.first_tensor_of_type(lab, "Q4_K")[1]
    good = tools.weight_roundtrip(lab, name)
    assert good.preserves_negatives and good.neg_frac_gpu > 0.1 and good.max_abs_err <= 1e-6
    lab.use("matmul_q4_k", "mins_added")
    bad = tools.weight_roundtrip(lab, name)
    assert not bad.preserves_negatives and bad.neg_frac_gpu < good.neg_frac_gpu


def test_logit_lens_last_layer_is_the_logits(tiny_model):
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    run = lab.run([1, 5, 9, 7, 3])
    lens = tools.logit_lens(lab, run)
    z, want = lens.Z[-1, 0].astype(np.float64), run.logits().astype(np.float64)
    assert np.sum((z - want) ** 2) / np.sum(want**2) < 1e-10  # the last layer's lens is the model's output
    top = int(np.argmax(want))
    assert lens.rank(top, -1) == 0 and lens.top(-1)[0].id == top and lens.positions == (4,)
    assert len(lens.ranks(top)) == lab.config.n_layers


# ----- every case on its real model ----------------------------------------------------------

_REPORTS: dict[str, dict] = {}
_OWN_LABS: dict[str, labkit.Lab] = {}


@pytest.fixture
def report(request, gemma, smollm) -> dict:
    """{"report": CaseReport.to_dict(), "text": its text()} of a case on its real model: what the case's
    notebook reported when it ran in this session (test_case_notebooks), or run here."""
    name = request.param
    if name in CASE_REPORTS:
        return CASE_REPORTS[name]
    if name not in _REPORTS:
        case = get_case(name)
        if case.open_kwargs or case.model not in ("gemma3-270m", "smollm2-135m"):
            lab = _OWN_LABS.setdefault(name, case.open_lab())
        else:
            lab = {"gemma3-270m": gemma, "smollm2-135m": smollm}[case.model]
        rep = run_case(name, lab=lab)
        _REPORTS[name] = json.loads(json.dumps({"report": rep.to_dict(), "text": rep.text()}))
    return _REPORTS[name]


@pytest.mark.slow
@pytest.mark.parametrize("report", NAMES, indirect=True)
def test_case_passes(report):
    assert report["report"]["passed"] is True, report["text"]
    assert report["text"].rstrip().splitlines()[-1].startswith("PASSED")


@pytest.mark.slow
@pytest.mark.parametrize("report", NAMES, indirect=True)
def test_every_symptom_under_the_fault_and_none_after_the_fix(report):
    d = report["report"]
    assert len(d["symptoms"]) >= 3
    for s in d["symptoms"]:
        assert s["faulty"]["present"], f"{d['name']}: symptom {s['name']!r} not observed: {s['faulty']['observed']}"
        assert not s["fixed"]["present"], (
            f"{d['name']}: symptom {s['name']!r} still there after the fix: {s['fixed']['observed']}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("report", NAMES, indirect=True)
def test_first_divergence_is_the_root_cause_stage(report):
    d = report["report"]
    assert d["first_divergence"] == EXPECTED_DIVERGENCE[d["name"]] == d["expected_divergence"], report["text"]


@pytest.mark.slow
@pytest.mark.parametrize("report", NAMES, indirect=True)
def test_checklist_passes_after_the_fix(report):
    d = report["report"]
    assert d["checklist"]
    for c in d["checklist"]:
        assert c["fixed"]["passed"], f"{d['name']}: {c['name']}: expected {c['expected']}, observed {c['fixed']}"
    assert not all(c["faulty"]["passed"] for c in d["checklist"]), "the checklist should catch the fault somewhere"


@pytest.mark.slow
def test_q4k_root_cause_is_the_first_q4k_matmul_in_the_file(gemma):
    from labkit.casebook import q4k_sign

    assert q4k_sign.root_cause_stage(gemma) == get_case("q4k-sign").root_cause_stage
    assert gemma.gguf.tensors["blk.0.ffn_down.weight"].type_name != "Q4_K"  # the FFN is only downstream


@pytest.mark.slow
def test_run_case_puts_the_labs_variants_back(smollm):
    smollm.use("attn_ctx", "streaming")
    try:
        rep = run_case("top-p-order", lab=smollm)
        assert rep.passed, rep.text()
        assert smollm.selected == {"attn_ctx": "streaming"}
    finally:
        smollm.use("attn_ctx", "default")
