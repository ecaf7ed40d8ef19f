"""What a case is made of: checks, the case itself, the evidence each side gathers, the report.

A case reproduces one post-mortem on a real model. It runs the model twice on one live Lab:
once with the fault's variants selected ("faulty"), once with the defaults ("fixed"), and
once through the float64 reference. Every symptom is a `Check` with its threshold written out
in `expected`; it must hold under the fault and not hold after the fix. The post-mortem's own
verification checklist is a second list of checks that must all pass after the fix. `clues`
are the post-mortem's misleading observations: they hold with *and* without the fault, which
is exactly why they misled.

A notebook drives the same steps by keyword and reads what they measured by name:

    ref = case.reference(lab)
    bad = case.observe(lab, side="faulty", reference=ref)   # the case's fault selected for the pass
    where = case.localize(lab, faulty=bad, reference=ref)  # where.stage, where.comparison
    bad.sky_step, bad.tier_logits.streaming_count          # each case's Evidence has named fields
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field, fields
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any, NamedTuple

from labkit.captures import Run
from labkit.compare import Comparison, failure_reason
from labkit.errors import LabkitError

if TYPE_CHECKING:
    from labkit.lab import Lab

POSTMORTEMS = resources.files("labkit.casebook") / "postmortems"  # copies of the originals, package data


class UnknownCaseError(LabkitError):
    """A case name that is not registered (see `labkit cases`)."""


class CaseLabError(LabkitError):
    """The Lab handed to a case does not fit it (another model, or other weight windows)."""


class UnknownSideError(LabkitError, ValueError):
    """A side other than "faulty" or "fixed" asked of `Case.observe`."""


class UnknownEvidenceError(LabkitError, LookupError):
    """A name that a side's evidence does not hold (see `Evidence.runs` and `Evidence.values`)."""


SIDES = ("faulty", "fixed")  # what Case.observe runs: the fault selected, or the fix


@dataclass
class Check:
    """One executable statement about a run.

    `expected` states the condition with its threshold, `observed` what was measured, and
    `passed` whether the condition holds. For a symptom "holds" means "the symptom is there"."""

    name: str
    expected: str
    observed: str
    passed: bool
    value: Any = None  # the main measured number, for machines

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "expected": self.expected,
            "observed": self.observed,
            "passed": bool(self.passed),
            "value": _jsonable(self.value),
        }


@dataclass(kw_only=True)
class Evidence:
    """What one side measured, by name.

    Each case module subclasses it with named fields: the passes it captured (`Run`s, for
    notebooks and figures) and the numbers its checks read. A notebook reads `ev.sky_step` or
    `ev.tier_logits.streaming_count`; `runs` and `values` list the fields by kind."""

    side: str  # "faulty", "fixed" or "reference"
    variants: dict[str, str] = field(default_factory=dict)  # the selection in force

    def _named(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("side", "variants")}

    @property
    def runs(self) -> dict[str, Run]:
        """The captured passes, by field name."""
        return {k: v for k, v in self._named().items() if isinstance(v, Run)}

    @property
    def values(self) -> dict[str, Any]:
        """Every other measurement, by field name."""
        return {k: v for k, v in self._named().items() if not isinstance(v, Run)}

    def run(self, name: str) -> Run:
        """One captured pass by name (`ev.run("sky_step")` is `ev.sky_step`)."""
        runs = self.runs
        if name not in runs:
            raise UnknownEvidenceError(f"the {self.side} side captured no run {name!r}; runs: {', '.join(runs)}")
        return runs[name]

    def __getitem__(self, key: str) -> Any:
        """A value by name, as before the named fields (`ev["greedy"]` is `ev.greedy`)."""
        return self.values[key]


class Localization(NamedTuple):
    """Where the faulty side first leaves the reference; unpacks as `stage, comparison`."""

    stage: str | None  # the first divergent stage (or a step after the pass, e.g. "sampling"); None: none
    comparison: Comparison | None  # the stage-by-stage comparison it was read from


Observe = Callable[[Any, str, dict[str, str], Evidence | None], Evidence]
Judge = Callable[[Evidence, Evidence, Evidence], list[Check]]  # (side, reference, faulty side)
Localize = Callable[[Any, Evidence, Evidence], tuple[str | None, Comparison | None]]


@contextmanager
def selection(lab: Lab, variants: dict[str, str]) -> Iterator[None]:
    """Every family on its default except `variants` inside the block; the lab's own selection after."""
    saved = dict(lab.selected)
    try:
        _reset(lab)
        for family, name in variants.items():
            lab.use(family, name)
        yield
    finally:
        _reset(lab)
        for family, name in saved.items():
            lab.use(family, name)


def _reset(lab: Lab) -> None:
    for family in list(lab.selected):
        lab.use(family, "default")


@dataclass
class CaseSpec:
    """A post-mortem as its module declares it (see Case for the steps a notebook calls).

    `symptoms`, `checklist` and `clues` are called as fn(side, reference, faulty): the side being
    judged, the reference, and the faulty side (so a check of the fixed run can name, say, the
    garbage token the fault produced). `reference`, `observe` and `localize` are the module's
    step functions; Case calls them through its methods of the same names."""

    name: str
    postmortem: str  # file id in labkit/casebook/postmortems, e.g. "001"; "" for a case of no post-mortem
    title: str
    model: str
    prompt: str
    fault: dict[str, str]  # {op family: faulty variant} (the sampler's under "sampling")
    fix: dict[str, str]  # the same families back on "default"
    root_cause_stage: str  # the stage the post-mortem's root cause names
    symptoms: Judge
    checklist: Judge
    lesson: str
    reference: InitVar[Callable[[Any], Evidence]]  # lab -> the reference side, measured once
    observe: InitVar[Observe]  # (lab, side, variants, reference or None) -> that side's evidence
    localize: InitVar[Localize]  # (lab, faulty, reference) -> (first divergent stage, comparison)
    clues: Judge | None = None
    story: str = ""  # the post-mortem's story in a paragraph (notebooks, `text()`)
    notes: list[str] = field(default_factory=list)  # what does not reproduce, and why
    extra_faults: list[dict[str, str]] = field(default_factory=list)  # also run under the fault
    setup: Callable[[], None] | None = None  # registers case-specific variants
    open_kwargs: dict[str, Any] = field(default_factory=dict)  # open_lab(model, **open_kwargs)
    _reference: Callable[[Any], Evidence] = field(init=False, repr=False, compare=False)
    _observe: Observe = field(init=False, repr=False, compare=False)
    _localize: Localize = field(init=False, repr=False, compare=False)

    def __post_init__(self, reference: Callable[[Any], Evidence], observe: Observe, localize: Localize) -> None:
        self._reference, self._observe, self._localize = reference, observe, localize


class Case(CaseSpec):
    """A post-mortem, runnable: `reference`, `observe` each side, `localize`, as `run_case` does."""

    @property
    def postmortem_path(self) -> Traversable | None:
        """The post-mortem's text file, read from package data (`.read_text()`)."""
        hits = sorted((p for p in POSTMORTEMS.iterdir() if p.name.startswith(f"{self.postmortem}_")), key=str)
        return hits[0] if hits else None

    def prepare(self) -> None:
        if self.setup is not None:
            self.setup()

    def open_lab(self):
        """A Lab on this case's model, opened the way the case needs it (no variants selected)."""
        from labkit.lab import open as open_lab

        self.prepare()
        return open_lab(self.model, **self.open_kwargs)

    def check_lab(self, lab) -> None:
        if lab.name != self.model:
            raise CaseLabError(f"case {self.name} runs on {self.model}, not {lab.name}")
        want = self.open_kwargs.get("window_bytes")
        if want is not None and lab.window_bytes != want:
            raise CaseLabError(
                f"case {self.name} needs open_lab({self.model!r}, window_bytes={want}); use case.open_lab()"
            )

    def variants(self, side: str) -> dict[str, str]:
        """The selection a side runs under: the case's fault ("faulty") or its fix ("fixed")."""
        if side not in SIDES:
            raise UnknownSideError(f"case {self.name} has no side {side!r}; sides: {', '.join(SIDES)}")
        return dict(self.fault if side == "faulty" else self.fix)

    def reference(self, lab: Lab) -> Evidence:
        """The reference side (the float64 engine; the GPU pass, where a case reads one, on defaults)."""
        self.check_lab(lab)
        with selection(lab, {}):
            return self._reference(lab)

    def observe(self, lab: Lab, side: str, *, reference: Evidence | None = None) -> Evidence:
        """One side measured on `lab`: "faulty" with the case's fault selected, "fixed" with its fix,
        every other family on its default; the lab's own selection is put back afterwards.
        `reference` is the reference side, for the cases whose measurements start from it."""
        variants = self.variants(side)
        self.check_lab(lab)
        self.prepare()
        with selection(lab, variants):
            return self._observe(lab, side, variants, reference)

    def localize(self, lab: Lab, *, faulty: Evidence, reference: Evidence) -> Localization:
        """The first stage where the faulty side leaves the reference, with the comparison."""
        return Localization(*self._localize(lab, faulty, reference))

    def summary(self) -> dict:
        return {
            "name": self.name,
            "postmortem": self.postmortem,
            "title": self.title,
            "model": self.model,
            "prompt": self.prompt,
            "fault": self.fault,
            "extra_faults": self.extra_faults,
            "fix": self.fix,
            "root_cause_stage": self.root_cause_stage,
        }


@dataclass
class CaseReport:
    case: Case
    symptoms_faulty: list[Check]
    symptoms_fixed: list[Check]
    first_divergence: str | None
    expected_divergence: str
    checklist_faulty: list[Check]
    checklist_fixed: list[Check]
    timings: dict[str, float] = field(default_factory=dict)
    clues_faulty: list[Check] = field(default_factory=list)
    clues_fixed: list[Check] = field(default_factory=list)
    comparison: Comparison | None = field(default=None, repr=False)
    evidence: dict[str, Evidence] = field(default_factory=dict, repr=False)

    @property
    def symptoms_observed(self) -> bool:
        return bool(self.symptoms_faulty) and all(c.passed for c in self.symptoms_faulty)

    @property
    def symptoms_absent_after_fix(self) -> bool:
        return not any(c.passed for c in self.symptoms_fixed)

    @property
    def localized(self) -> bool:
        return self.first_divergence == self.expected_divergence

    @property
    def checklist_passes(self) -> bool:
        return bool(self.checklist_fixed) and all(c.passed for c in self.checklist_fixed)

    @property
    def clues_hold(self) -> bool:
        return all(c.passed for c in self.clues_faulty + self.clues_fixed)

    @property
    def passed(self) -> bool:
        """Every symptom seen under the fault and gone after the fix, the first divergence where
        the post-mortem's root cause is, and the whole checklist passing after the fix."""
        return (
            self.symptoms_observed
            and self.symptoms_absent_after_fix
            and self.localized
            and self.checklist_passes
            and self.clues_hold
        )

    def to_dict(self) -> dict:
        def pair(faulty: list[Check], fixed: list[Check], key: str) -> list[dict]:
            out = []
            for a, b in zip(faulty, fixed):
                out.append(
                    {
                        "name": a.name,
                        "expected": a.expected,
                        "faulty": {"observed": a.observed, key: bool(a.passed), "value": _jsonable(a.value)},
                        "fixed": {"observed": b.observed, key: bool(b.passed), "value": _jsonable(b.value)},
                    }
                )
            return out

        cmp = None
        if self.comparison is not None:
            failed = [r for r in self.comparison.rows if not r.passed]
            cmp = {
                "a": self.comparison.a_engine,
                "b": self.comparison.b_engine,
                "first_divergence": self.comparison.first_divergence,
                "failed_stages": len(failed),
                "stages": len(self.comparison.rows),
                "first_failures": [
                    {"stage": r.stage, "nmse": r.nmse, "threshold": r.threshold, "reason": r.reason} for r in failed[:3]
                ],
            }
        return _jsonable(
            {
                **self.case.summary(),
                "passed": self.passed,
                "symptoms": pair(self.symptoms_faulty, self.symptoms_fixed, "present"),
                "symptoms_observed": self.symptoms_observed,
                "symptoms_absent_after_fix": self.symptoms_absent_after_fix,
                "first_divergence": self.first_divergence,
                "expected_divergence": self.expected_divergence,
                "localized": self.localized,
                "comparison": cmp,
                "checklist": pair(self.checklist_faulty, self.checklist_fixed, "passed"),
                "checklist_passes": self.checklist_passes,
                "clues": pair(self.clues_faulty, self.clues_fixed, "holds"),
                "lesson": self.case.lesson,
                "notes": self.case.notes,
                "timings": self.timings,
            }
        )

    def text(self) -> str:
        c = self.case
        faults = ", ".join(f"{k}={v}" for k, v in c.fault.items())
        for extra in c.extra_faults:
            faults += " (and " + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
        lines = [
            f"case {c.name} ({f'post-mortem {c.postmortem}' if c.postmortem else 'not from a post-mortem'}): {c.title}",
            f"model {c.model}, prompt {c.prompt!r}",
            f"fault: {faults}   fix: " + ", ".join(f"{k}={v}" for k, v in c.fix.items()),
            "",
            "symptoms (must be present under the fault and absent after the fix)",
        ]
        for a, b in zip(self.symptoms_faulty, self.symptoms_fixed):
            ok = a.passed and not b.passed
            lines.append(f"  [{'ok' if ok else 'FAIL'}] {a.name}: {a.expected}")
            lines.append(f"       faulty: {'present' if a.passed else 'ABSENT'} - {a.observed}")
            lines.append(f"       fixed:  {'PRESENT' if b.passed else 'absent'} - {b.observed}")
        mark = "ok" if self.localized else "FAIL"
        lines += ["", f"first divergence: {self.first_divergence}  (expected {self.expected_divergence}) [{mark}]"]
        if self.comparison is not None:
            failed = [r for r in self.comparison.rows if not r.passed]
            for r in failed[:3]:
                lines.append(f"  {r.stage:26} {failure_reason(r)}")
            if len(failed) > 3:
                lines.append(f"  ... {len(failed) - 3} more failing stages of {len(self.comparison.rows)}")
        lines += ["", "checklist (the post-mortem's, as checks: must pass after the fix)"]
        for a, b in zip(self.checklist_faulty, self.checklist_fixed):
            lines.append(f"  [{'ok' if b.passed else 'FAIL'}] {a.name}: {a.expected}")
            lines.append(f"       faulty: {'pass' if a.passed else 'fail'} - {a.observed}")
            lines.append(f"       fixed:  {'pass' if b.passed else 'FAIL'} - {b.observed}")
        if self.clues_faulty:
            lines += ["", "misleading clues (hold with and without the fault)"]
            for a, b in zip(self.clues_faulty, self.clues_fixed):
                lines.append(f"  [{'ok' if a.passed and b.passed else 'FAIL'}] {a.name}: {a.expected}")
                lines.append(f"       faulty: {a.observed}")
                lines.append(f"       fixed:  {b.observed}")
        if c.notes:
            lines += ["", "notes"] + [f"  - {n}" for n in c.notes]
        lines += ["", f"lesson: {c.lesson}"]
        t = ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items())
        lines += ["", f"{'PASSED' if self.passed else 'FAILED'}  ({t})"]
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython
        p.text(self.text())


def _jsonable(x: Any) -> Any:
    """numpy scalars/arrays and tuples into plain JSON types (NaN/inf as strings)."""
    import math

    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if hasattr(x, "_asdict"):  # a NamedTuple (TopToken): its fields by name
        return _jsonable(x._asdict())
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.bool_ | bool):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating | float):
        f = float(x)
        return f if math.isfinite(f) else str(f)
    return x


class Timer:
    """Collects named wall-clock durations: `with timer("faulty"): ...`. Given a progress bar
    (labkit.progress.bar), each step shows its name on it and advances it once done."""

    def __init__(self, bar: Any = None) -> None:
        self.timings: dict[str, float] = {}
        self.bar = bar

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.bar is not None:
            self.bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        if self.bar is not None:
            self.bar.update(1)


# ----- helpers for writing checks ----------------------------------------------------------


def fmt(x: float) -> str:
    """A compact number: 3 significant digits, scientific when large or tiny."""
    if x != x:
        return "nan"
    ax = abs(x)
    if ax != 0 and (ax >= 1e5 or ax < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"
