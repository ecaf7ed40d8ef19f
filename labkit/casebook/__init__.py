"""The post-mortem cases: reproduce the fault, report its symptoms, localize it, fix it, check.

    from labkit.casebook import cases, get_case, run_case
    [c.name for c in cases()]          # q4k-sign, sky-kaw, lm-head-unwritten, norm-cascade, top-p-order,
                                       # rope-style
    report = run_case("q4k-sign")      # faulty pass, reference, localization, fixed pass, checklist
    report.passed, report.text(), report.to_dict()

`run_case(name, lab=)` reuses a live Lab opened on the case's model (see `Case.open_lab()`); the
Lab's variant selection is put back as it was afterwards. A progress bar follows its steps
(`labkit.progress`; off under `labkit case NAME --json`).

A notebook takes the same steps one at a time, by keyword, and reads the evidence by name:

    case = get_case("sky-kaw")
    lab = case.open_lab()
    ref = case.reference(lab)
    bad = case.observe(lab, side="faulty", reference=ref)   # "fixed": the fix instead
    where = case.localize(lab, faulty=bad, reference=ref)  # Localization(stage, comparison)
    bad.sky_step.top(5), bad.tier_logits.streaming_count
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.casebook.base import (
    SIDES,
    Case,
    CaseLabError,
    CaseReport,
    Check,
    Evidence,
    Localization,
    UnknownCaseError,
    UnknownEvidenceError,
    UnknownSideError,
    selection,
)
from labkit.casebook.base import Timer as _Timer
from labkit.progress import bar

if TYPE_CHECKING:
    from labkit.lab import Lab

__all__ = [
    "SIDES",
    "Case",
    "CaseLabError",
    "CaseReport",
    "Check",
    "Evidence",
    "Localization",
    "UnknownCaseError",
    "UnknownEvidenceError",
    "UnknownSideError",
    "cases",
    "get_case",
    "run_case",
]

STEPS = ("open", "reference", "faulty", "localize", "fixed", "checks")  # run_case's, in order


def _registry() -> dict[str, Case]:
    from labkit.casebook import (
        batch_crosstalk,
        lm_head_unwritten,
        moe_router,
        norm_cascade,
        norm_cascade_bitnet,
        q4k_sign,
        rope_style,
        sky_kaw,
        top_p_order,
    )

    found = [q4k_sign.CASE, sky_kaw.CASE, lm_head_unwritten.CASE, norm_cascade.CASE, top_p_order.CASE, rope_style.CASE,
             norm_cascade_bitnet.CASE, moe_router.CASE, batch_crosstalk.CASE]  # fmt: skip
    return {c.name: c for c in found}


def cases() -> list[Case]:
    """Every registered case, in post-mortem order."""
    return list(_registry().values())


def get_case(name: str) -> Case:
    reg = _registry()
    if name not in reg:
        raise UnknownCaseError(f"unknown case {name!r}; cases: {', '.join(reg)}")
    return reg[name]


def run_case(name: str, lab: Lab | None = None) -> CaseReport:
    """Run a case end to end on its real model and return the report (see CaseReport.passed)."""
    case = get_case(name)
    with bar(len(STEPS), f"case {name}", unit="step") as progress:
        timer = _Timer(progress)
        with timer("open"):
            case.prepare()
            if lab is None:
                lab = case.open_lab()
            else:
                case.check_lab(lab)
        with selection(lab, {}):  # from the defaults; the lab's own selection back afterwards
            report = _run_steps(case, lab, timer)
    report.timings = dict(timer.timings)
    report.timings["total"] = sum(timer.timings.values())
    return report


def _run_steps(case: Case, lab: Lab, timer: _Timer) -> CaseReport:
    with timer("reference"):
        ref = case.reference(lab)
    with timer("faulty"):
        faulty = case.observe(lab, "faulty", reference=ref)
    with timer("localize"):
        stage, comparison = case.localize(lab, faulty=faulty, reference=ref)
    with timer("fixed"):
        fixed = case.observe(lab, "fixed", reference=ref)
    with timer("checks"):
        return CaseReport(
            case=case,
            symptoms_faulty=case.symptoms(faulty, ref, faulty),
            symptoms_fixed=case.symptoms(fixed, ref, faulty),
            first_divergence=stage,
            expected_divergence=case.root_cause_stage,
            checklist_faulty=case.checklist(faulty, ref, faulty),
            checklist_fixed=case.checklist(fixed, ref, faulty),
            clues_faulty=case.clues(faulty, ref, faulty) if case.clues else [],
            clues_fixed=case.clues(fixed, ref, faulty) if case.clues else [],
            comparison=comparison,
            evidence={"faulty": faulty, "fixed": fixed, "reference": ref},
        )
