"""The post-mortem cases: reproduce the fault, report its symptoms, localize it, fix it, check.

    from labkit.cases import cases, get_case, run_case
    [c.name for c in cases()]          # q4k-sign, sky-kaw, lm-head-unwritten, norm-cascade, top-p-order,
                                       # rope-style
    report = run_case("q4k-sign")      # faulty pass, reference, localization, fixed pass, checklist
    report.passed, report.text(), report.to_dict()

`run_case(name, lab=)` reuses a live Lab opened on the case's model (see `Case.open_lab()`); the
Lab's variant selection is put back as it was afterwards.
"""

from __future__ import annotations

from labkit.cases.base import Case, CaseLabError, CaseReport, Check, Evidence, UnknownCaseError
from labkit.cases.base import Timer as _Timer

__all__ = [
    "Case",
    "CaseLabError",
    "CaseReport",
    "Check",
    "Evidence",
    "UnknownCaseError",
    "cases",
    "get_case",
    "run_case",
]


def _registry() -> dict[str, Case]:
    from labkit.cases import lm_head_unwritten, norm_cascade, q4k_sign, rope_style, sky_kaw, top_p_order

    found = [q4k_sign.CASE, sky_kaw.CASE, lm_head_unwritten.CASE, norm_cascade.CASE, top_p_order.CASE, rope_style.CASE]
    return {c.name: c for c in found}


def cases() -> list[Case]:
    """Every registered case, in post-mortem order."""
    return list(_registry().values())


def get_case(name: str) -> Case:
    reg = _registry()
    if name not in reg:
        raise UnknownCaseError(f"unknown case {name!r}; cases: {', '.join(reg)}")
    return reg[name]


def _select(lab, variants: dict[str, str]) -> None:
    for family, name in variants.items():
        lab.use(family, name)


def run_case(name: str, lab=None) -> CaseReport:
    """Run a case end to end on its real model and return the report (see CaseReport.passed)."""
    case = get_case(name)
    timer = _Timer()
    with timer("open"):
        case.prepare()
        if lab is None:
            lab = case.open_lab()
        else:
            case.check_lab(lab)
    saved = dict(lab.selected)
    try:
        for family in list(lab.selected):  # start from the defaults
            lab.use(family, "default")
        with timer("reference"):
            ref = case.reference(lab)
        with timer("faulty"):
            _select(lab, case.fault)
            faulty = case.observe(lab, "faulty", dict(case.fault), ref)
        with timer("localize"):
            stage, comparison = case.localize(lab, faulty, ref)
        with timer("fixed"):
            _select(lab, case.fix)
            fixed = case.observe(lab, "fixed", dict(case.fix), ref)
        with timer("checks"):
            report = CaseReport(
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
    finally:
        for family in list(lab.selected):
            lab.use(family, "default")
        _select(lab, saved)
    report.timings = dict(timer.timings)
    report.timings["total"] = sum(timer.timings.values())
    return report
