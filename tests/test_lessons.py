"""The lessons (notebooks 01–04 and 06–10) run top to bottom in a real Jupyter kernel; every exercise check
passes with the shipped (reference) answers; the committed outputs still match the code; and the
lesson figures are interactive plotly figures that carry a still PNG for viewers without plotly."""

from __future__ import annotations

import ast
import re

import nbformat
import pytest
from notebook_outputs import (
    LESSONS,
    ROOT,
    assert_outputs_match,
    assert_shippable,
    cell_text,
    errors,
    executed,
    with_worked_answers,
)

PLOTLY = "application/vnd.plotly.v1+json"


def checks(nb) -> list[str]:
    """The text of every exercise check cell."""
    return [cell_text(c) for c in nb.cells if c.cell_type == "code" and c.id.endswith("-check")]


def plotly_outputs(cell) -> list[dict]:
    return [o for o in cell.get("outputs", []) if PLOTLY in o.get("data", {})]


@pytest.fixture(params=LESSONS)
def lesson(request):
    return (request.param, *executed(request.param))


@pytest.mark.slow
def test_lesson_runs_and_every_check_passes(lesson):
    name, _, nb = lesson
    assert not errors(nb), errors(nb)
    results = checks(nb)
    assert len(results) >= 2, f"{name}: {len(results)} exercise checks"
    failed = [r for r in results if "✓" not in r or "✗" in r]
    assert not failed, f"{name}: {failed}"
    # each exercise has its question, a (collapsed) worked answer, and the check
    answers = [c for c in nb.cells if c.id.endswith("-answer")]
    assert len(answers) == len(results) and all("solution" in c.metadata.get("tags", []) for c in answers)


@pytest.mark.slow
def test_lesson_outputs_match_their_code(lesson):
    name, committed, nb = lesson
    assert_outputs_match(committed, nb)
    assert_shippable(name)


@pytest.mark.parametrize("name", [*LESSONS, "05_sweeps"])
def test_exercises_ship_unanswered_with_a_collapsed_worked_answer(name):
    """As committed, each student cell is the stub and its check says plainly that nothing is written
    yet; the worked answer follows the check, collapsed, and holds code the tests can run."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells = {c.id: c for c in nb.cells}
    exercises = [c.id[: -len("-check")] for c in nb.cells if c.id.endswith("-check")]
    assert len(exercises) >= 2, name
    order = [c.id for c in nb.cells]
    for ex in exercises:
        student, check, answer = cells[f"{ex}-student"], cells[f"{ex}-check"], cells[f"{ex}-answer"]
        assert student.source.startswith("answer = ...") and student.cell_type == "code", (name, ex)
        shown = cell_text(check)
        assert shown.startswith("○") and "nothing written yet" in shown, (name, ex, shown)
        assert answer.cell_type == "markdown" and answer.source.startswith("<details>"), (name, ex)
        assert "```python" in answer.source and "solution" in answer.metadata.get("tags", [])
        assert order.index(f"{ex}-student") < order.index(f"{ex}-check") < order.index(f"{ex}-answer")
    assert with_worked_answers(nb) == len(exercises)
    # the first cell tells the student how they ship: unanswered (○), the worked answer collapsed below
    intro = nb.cells[0].source
    assert "hidden worked solution" not in intro and "holds a worked solution" not in intro, name
    if "Exercises end with a check cell" in intro:
        assert "○" in intro and "collapsed" in intro, (name, intro[-300:])


@pytest.mark.slow
def test_lesson_figures_are_interactive_with_a_still(lesson):
    name, committed, _ = lesson
    figs = [o for c in committed.cells if c.cell_type == "code" for o in plotly_outputs(c)]
    assert figs, f"{name} shows no plotly figure"
    for o in figs:
        data = o["data"]
        assert "image/png" in data and len(data["image/png"]) > 1000, "a plotly figure without its still PNG"
        title = data[PLOTLY]["layout"]["title"]["text"]
        models = "gemma3-270m|smollm2-135m|tiny-gemma3|tiny-qwen3moe|tiny-mamba2|tiny-deepseek2"
        assert re.search(rf"· ({models}) · (gpu|reference)", title), title


WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.mark.slow
def test_walkthrough_teaches_each_stage_and_keeps_its_tools():
    _, nb = executed("01_walkthrough")
    cells = {c.id: c for c in nb.cells if c.cell_type == "code"}
    # each stage section shows what it computes and recomputes it by hand, within float32 rounding
    for cid in ("embed", "norm", "rope", "attn", "ctx", "ffn"):
        html = "".join(o.get("data", {}).get("text/html", "") for o in cells[cid].outputs)
        assert "labkit-explain" in html, cid
        diffs = [float(x) for x in re.findall(r"max \|[^:]*: ([0-9.e+-]+)", cell_text(cells[cid]))]
        assert diffs and max(diffs) < 1e-4, (cid, diffs)
    assert "' blue'" in cell_text(cells["run"]) and "' a'" in cell_text(cells["run"])
    widgets = [c.id for c in cells.values() if any(WIDGET in o.get("data", {}) for o in c.outputs)]
    assert {"f6fcc816", "attn-explorer", "variants", "stepper"} <= set(widgets), widgets
    html = "".join(o["data"].get("text/html", "") for o in cells["run-glance"].outputs if "data" in o)
    assert "labkit-run" in html and "no NaN, inf or unwritten" in html
    assert "&lt;bos&gt;" in html and " sky" in html and "&#x27; blue&#x27;" in html
    shown = "".join(o["data"].get("text/html", "") for o in cells["array-show"].outputs if "data" in o)
    assert shown.count("labkit-array") == 2 and shown.count("labkit-explain") == 2
    assert "blk.17.resid_out" in shown and "masked (-inf)" in shown
    rope = cell_text(cells["variants-rope"])
    assert "first divergence: blk.0.q_rope" in rope and "recomputed from blk.0.q_rope" in rope, rope
    assert plotly_outputs(cells["variants-rope"]) and plotly_outputs(cells["reference"])
    assert "first divergence: None" in cell_text(cells["variants-back"])
    assert "same top-3 tokens in the same order: True" in cell_text(cells["variants-rope-top"])  # the prose says so
    assert "unwritten elements in the correct pass: 0" in cell_text(cells["debug-clean"])
    assert "unwritten per stage: {'logits': " in cell_text(cells["debug-lm-head"])
    debug_html = "".join(o["data"].get("text/html", "") for o in cells["debug-lm-head"].outputs if "data" in o)
    assert "logits" in debug_html and "unwritten" in debug_html and "453355" in debug_html  # the flagged stage
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "lab.generate" in code[-1].source and cell_text(code[-1]).strip()  # the browser test waits for it


def test_induction_pairs_come_from_the_tokens():
    """Lesson 02's induction keys: the key after the latest earlier occurrence of the query's token.
    "The cat sat on the mat. The cat sat on the" has period 7 (` mat` and `.` count, `The` is not
    ` The`), so the second copy's queries 8..11 look at keys 2..5."""
    from labkit.lessons import induction_pairs

    qs, ks = induction_pairs([7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4])
    assert qs.tolist() == [8, 9, 10, 11] and ks.tolist() == [2, 3, 4, 5]
    qs, ks = induction_pairs([5, 5, 9, 5])  # the latest occurrence counts
    assert qs.tolist() == [1, 3] and ks.tolist() == [1, 2]


# ----- the rules every lesson keeps (issue 65): hints point to the idea; most exercises are written code


_CALL_OR_INDEX = re.compile(r"[\w\])][(\[]|\b(?:np|lab|labkit)\.|(?<![<>!=])=(?!=)")


def worked_code(cell) -> str:
    """A worked answer's Python, comments dropped."""
    code = re.search(r"```python\n(.*?)\n```", cell.source, re.DOTALL).group(1)
    return "\n".join(line.split("#", 1)[0] for line in code.splitlines())


def hint_of(check_cell) -> str:
    m = re.search(r"hint=(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')", check_cell.source)
    return ast.literal_eval(m.group(1)) if m else ""


def shares_code(hint: str, code: str, run: int = 12) -> str | None:
    """A run of `run` non-space characters the hint shares with the code, if any."""
    h, c = re.sub(r"\s+", "", hint), re.sub(r"\s+", "", code)
    return next((h[i : i + run] for i in range(len(h) - run + 1) if h[i : i + run] in c), None)


def statements(code: str) -> int:
    """Python statements, nested ones counted: a def with two body lines is three."""
    return sum(isinstance(n, ast.stmt) for n in ast.walk(ast.parse(code)))


def is_written(code: str) -> bool:
    """An answer the student writes rather than looks up: three statements or more, or a kernel (a WGSL
    string of more than five lines)."""
    strings = [n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return statements(code) >= 3 or any(s.count("\n") > 5 for s in strings)


def exercises_of(name: str) -> list[tuple[str, object, object]]:
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells = {c.id: c for c in nb.cells}
    return [(c.id[: -len("-check")], c, cells[c.id[: -len("-check")] + "-answer"]) for c in nb.cells
            if c.id.endswith("-check")]  # fmt: skip


def test_the_rule_checks_catch_code():
    assert _CALL_OR_INDEX.search("np.argsort over the rows") and _CALL_OR_INDEX.search("take x[0]")
    assert _CALL_OR_INDEX.search("exp(z) then divide") and _CALL_OR_INDEX.search("w = 1")
    assert not _CALL_OR_INDEX.search("the sum of squares, over the group's size (not the row's), then eps <= 1e-5")
    assert shares_code("the argsort of minus probs", "answer = np.argsort(-probs)[:, :k]") is None
    assert shares_code("use argsort(-probs)[:, :k]", "answer = np.argsort(-probs)[:, :k]") == "argsort(-pro"
    assert statements("def f(x):\n    y = x\n    return y") == 3 and statements("answer = f(1)") == 1
    assert is_written('answer = """\n' + "a;\n" * 6 + '"""') and not is_written("answer = x[0]")


@pytest.mark.parametrize("name", [*LESSONS, "05_sweeps"])
def test_hints_point_to_the_idea_not_the_code(name):
    """A hint in words: no call, index or assignment, no `np.`, and no 12-character run of the worked
    answer's code (the reviewers found hints that were the argsort itself, or the answer verbatim)."""
    for ex, check, answer in exercises_of(name):
        hint = hint_of(check)
        assert not _CALL_OR_INDEX.search(hint), f"{name} {ex}: the hint is code: {hint!r}"
        shared = shares_code(hint, worked_code(answer))
        assert shared is None, f"{name} {ex}: the hint gives the worked answer's code away ({shared!r}): {hint!r}"


@pytest.mark.parametrize("name", [*LESSONS, "05_sweeps"])
def test_at_least_half_the_exercises_are_written_code(name):
    """At least half (rounded up) of a lesson's exercises make the student write code of several
    statements (or a kernel), not look a number up."""
    found = exercises_of(name)
    written = [ex for ex, _, answer in found if is_written(worked_code(answer))]
    assert 2 * len(written) >= len(found), f"{name}: {len(written)} of {len(found)} exercises are written code"
