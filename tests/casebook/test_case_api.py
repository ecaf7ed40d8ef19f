"""The cases' public API: `case.reference/observe/localize` by keyword, evidence read by name, a
progress bar over `run_case`'s steps (none under `labkit case NAME --json`), and case notebooks
that use nothing else (no `dict(case.fault)`, no evidence read by dictionary key)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pytest

import labkit
from labkit import progress
from labkit.captures import Run
from labkit.casebook import (
    STEPS,
    Case,
    Evidence,
    Localization,
    UnknownEvidenceError,
    UnknownSideError,
    get_case,
)
from labkit.casebook.base import _jsonable

ROOT = Path(__file__).resolve().parents[2]
cases_mod = importlib.import_module("labkit.casebook")  # the package (labkit.cases is the function)
MODULES = ["q4k_sign", "sky_kaw", "lm_head_unwritten", "norm_cascade", "top_p_order", "rope_style"]


# ----- a case with recording steps, on a lab that only keeps a selection ----------------------


class FakeLab:
    name = "smollm2-135m"
    window_bytes = None

    def __init__(self, selected: dict[str, str] | None = None) -> None:
        self.selected = dict(selected or {})

    def use(self, family: str, name: str = "default") -> FakeLab:
        if name == "default":
            self.selected.pop(family, None)
        else:
            self.selected[family] = name
        return self


@dataclasses.dataclass(kw_only=True)
class Seen(Evidence):
    """What a recording step saw: the lab's selection during the call, and what it was passed."""

    selected: dict[str, str]
    reference: Evidence | None = None


def recording_case() -> Case:
    def reference(lab):
        return Seen(side="reference", selected=dict(lab.selected))

    def observe(lab, side, variants, ref):
        return Seen(side=side, variants=variants, selected=dict(lab.selected), reference=ref)

    def localize(lab, faulty, ref):
        return "blk.0.rope", None

    return Case(
        name="t",
        postmortem="000",
        title="t",
        model="smollm2-135m",
        prompt="p",
        fault={"rope": "normal_pairs"},
        fix={"rope": "default"},
        root_cause_stage="blk.0.rope",
        symptoms=lambda ev, ref, faulty: [],
        checklist=lambda ev, ref, faulty: [],
        lesson="l",
        reference=reference,
        observe=observe,
        localize=localize,
    )


def test_observe_runs_a_side_under_its_own_variants_and_puts_the_selection_back():
    case, lab = recording_case(), FakeLab({"attn_ctx": "streaming"})
    ref = case.reference(lab)
    assert ref.selected == {}  # the reference on the defaults
    bad = case.observe(lab, side="faulty", reference=ref)
    assert bad.side == "faulty" and bad.variants == case.fault and bad.reference is ref
    assert bad.selected == case.fault  # the fault alone, every other family on its default
    good = case.observe(lab, side="fixed")
    assert good.selected == {} and good.variants == case.fix and good.reference is None
    assert lab.selected == {"attn_ctx": "streaming"}
    where = case.localize(lab, faulty=bad, reference=ref)
    assert isinstance(where, Localization) and where.stage == "blk.0.rope" and where.comparison is None
    stage, cmp = where  # unpacks as the module's (stage, comparison)
    assert stage == "blk.0.rope"


def test_an_unknown_side_is_a_typed_error():
    case, lab = recording_case(), FakeLab({"attn_ctx": "streaming"})
    for side in ("reference", "broken", ""):
        with pytest.raises(UnknownSideError) as e:
            case.observe(lab, side=side)
        assert isinstance(e.value, labkit.LabkitError) and "faulty" in str(e.value)
    assert lab.selected == {"attn_ctx": "streaming"}


def test_a_lab_on_another_model_is_refused_by_every_step():
    case, lab = recording_case(), FakeLab()
    lab.name = "gemma3-270m"
    with pytest.raises(labkit.LabkitError):
        case.reference(lab)
    with pytest.raises(labkit.LabkitError):
        case.observe(lab, side="faulty")


# ----- evidence by name -----------------------------------------------------------------------


def test_evidence_reads_by_attribute_and_lists_runs_and_values():
    @dataclasses.dataclass(kw_only=True)
    class Ev(Evidence):
        prompt: Run
        greedy: list[int]

    run = Run("m", "gpu", [1, 2], ["logits"], {"logits": np.zeros((2, 4), np.float32)})
    ev = Ev(side="faulty", variants={"rope": "normal_pairs"}, prompt=run, greedy=[3, 3])
    assert ev.prompt is run and ev.run("prompt") is run and ev.runs == {"prompt": run}
    assert ev.values == {"greedy": [3, 3]} and ev["greedy"] == [3, 3]  # the old key access still reads
    with pytest.raises(UnknownEvidenceError) as e:
        ev.run("sky_step")
    assert isinstance(e.value, labkit.LabkitError) and "prompt" in str(e.value)
    with pytest.raises(KeyError):
        ev["prompt"]  # a run is not a value


def test_every_case_module_names_its_evidence():
    """Each case's evidence is a dataclass of named fields; no field holds an anonymous dict of
    measurements (the notebook would read it by key)."""
    for kind in evidence_classes():
        names = [f.name for f in dataclasses.fields(kind)]
        assert names[:2] == ["side", "variants"] and len(names) > 2, kind
        assert kind.__doc__ and not kind.__doc__.startswith(kind.__name__ + "("), f"{kind.__name__} has no docstring"


def test_sky_kaw_tier_logits_are_named_after_the_workgroup_variants():
    from labkit.casebook.sky_kaw import TierLogits
    from labkit.ops.registry import variants

    assert set(TierLogits._fields) <= set(variants()["attn_workgroups"])
    assert TierLogits._fields[0] == "streaming_count"  # the wrong count, measured first


# ----- progress --------------------------------------------------------------------------------


class RecordingBar:
    def __init__(self, total: int, desc: str, unit: str = "it", min_total: int = 2) -> None:
        self.total, self.desc, self.steps, self.done, self.closed = total, desc, [], 0, False

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.steps.append(s)

    def update(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> RecordingBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def test_run_case_shows_a_bar_over_its_steps(monkeypatch):
    case, lab, bars = recording_case(), FakeLab({"attn_ctx": "streaming"}), []
    monkeypatch.setattr(cases_mod, "_registry", lambda: {"t": case})
    monkeypatch.setattr(cases_mod, "bar", lambda *a, **k: bars.append(RecordingBar(*a, **k)) or bars[-1])
    report = cases_mod.run_case("t", lab=lab)
    (b,) = bars
    assert b.total == len(STEPS) == b.done and b.steps == list(STEPS) and b.closed and "t" in b.desc
    assert list(report.timings) == [*STEPS, "total"]
    assert report.evidence["faulty"].selected == case.fault and report.evidence["fixed"].selected == {}
    assert report.first_divergence == "blk.0.rope" and lab.selected == {"attn_ctx": "streaming"}


def test_labkit_case_json_runs_without_bars(monkeypatch, capsys):
    from labkit.cli import main

    seen = []

    class Report:
        passed = True

        def to_dict(self) -> dict:
            return {"name": "t", "passed": True}

        def text(self) -> str:
            return "case t: PASSED"

    def fake_run_case(name: str, lab=None) -> Report:
        seen.append(progress.enabled())
        return Report()

    monkeypatch.setattr(cases_mod, "run_case", fake_run_case)
    monkeypatch.setattr(progress, "_enabled", True)
    assert main(["case", "t", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "t", "passed": True}
    assert seen == [False] and progress.enabled()  # off for the command, back on after


# ----- the named API against the module functions, on the real model -------------------------


@pytest.mark.slow
def test_the_named_api_measures_what_the_module_functions_measure(smollm):
    from labkit.casebook import norm_cascade

    case = get_case("norm-cascade")
    case.prepare()
    ref = case.reference(smollm)
    bad = case.observe(smollm, side="faulty", reference=ref)
    good = case.observe(smollm, side="fixed", reference=ref)
    assert smollm.selected == {}
    for family, name in case.fault.items():  # the same side, by hand through the module
        smollm.use(family, name)
    try:
        by_hand = norm_cascade.observe(smollm, "faulty", dict(case.fault), ref)
    finally:
        for family in case.fault:
            smollm.use(family, "default")
    for stage in ("blk.0.attn_norm", "blk.0.q", "blk.1.attn_norm", "logits"):
        np.testing.assert_array_equal(bad.prompt[stage], by_hand.prompt[stage], err_msg=stage)
    assert not np.allclose(good.prompt["blk.0.attn_norm"], bad.prompt["blk.0.attn_norm"])  # each side its own

    def numbers(ev: Evidence) -> str:
        return json.dumps(_jsonable([c.value for c in case.symptoms(ev, ref, bad)]))

    assert numbers(bad) == numbers(by_hand)
    where = case.localize(smollm, faulty=bad, reference=ref)
    stage, cmp = norm_cascade.localize(smollm, by_hand, ref)
    assert where.stage == stage == case.root_cause_stage
    assert [r.nmse for r in where.comparison.rows] == [r.nmse for r in cmp.rows]


# ----- the notebooks use the public API only ----------------------------------------------------

RUN_STAGES = {"logits"}  # evidence field names that are stages too: run["logits"] reads a Run


def evidence_classes() -> list[type]:
    mods = [importlib.import_module(f"labkit.casebook.{m}") for m in [*MODULES, "tools"]]
    found = {obj for mod in mods for obj in vars(mod).values() if isinstance(obj, type) and issubclass(obj, Evidence)}
    return sorted(found - {Evidence}, key=lambda c: c.__name__)


def evidence_names() -> set[str]:
    """Every name a notebook might have read by key: evidence fields and their named parts."""
    from labkit.casebook.lm_head_unwritten import DecodeStep, RowWindow
    from labkit.casebook.sky_kaw import TierLogits
    from labkit.casebook.top_p_order import Sampling

    names = {f.name for kind in evidence_classes() for f in dataclasses.fields(kind)}
    names |= {*TierLogits._fields, *DecodeStep._fields, *RowWindow._fields, *Localization._fields}
    names |= {f.name for f in dataclasses.fields(Sampling)}
    return names - {"side", "variants"} - RUN_STAGES


def internal_access(code: str, keys: set[str]) -> list[str]:
    """What in a notebook's code reaches past the public case API."""
    modules = "|".join(MODULES)
    bad = re.findall(rf"\b(?:{modules})\.(?:observe|reference|localize)\(", code)
    bad += re.findall(r"dict\(case\.(?:fault|fix)\)|\.(?:runs|values)\[", code)
    bad += [m.group(0) for m in re.finditer(r"""\[(["'])(\w+)\1\]""", code) if m.group(2) in keys]
    return bad


def test_the_grep_finds_the_old_internal_calls():
    keys = evidence_names()
    assert {"sky_step", "tier_logits", "streaming_count", "lens", "steps", "text"} <= keys
    old = 'bad = sky_kaw.observe(lab, "faulty", dict(case.fault), None)\nstep = bad.runs["sky_step"]\n'
    old += 'w = ev["tier_logits"]["streaming_count"]\nev["text"], ev[\'steps\'][:2]\n'
    assert len(internal_access(old, keys)) == 8
    assert internal_access('z = run["logits"][-1]\nbad.tier_logits.streaming_count', keys) == []


@pytest.mark.parametrize("name", [c.replace("_", "-") for c in MODULES])
def test_case_notebooks_use_the_public_api_only(name):
    nb = nbformat.read(ROOT / "notebooks" / f"case_{name}.ipynb", as_version=4)
    keys = evidence_names()
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not internal_access(cell.source, keys), f"{cell.id}: {internal_access(cell.source, keys)}"
