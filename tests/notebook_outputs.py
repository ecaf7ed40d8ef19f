"""Committed notebooks carry their outputs; these helpers check that the outputs still come from
the code beside them: a notebook is executed again and each code cell's outputs are compared with
the committed ones by kind, text and numbers, never pixels.

Numbers are compared with a tolerance per kind (`number_kind`): timings and rates vary run to run
and are not compared; sizes within 5%; percentages within 2 points; errors in scientific notation
within half a decade; ratios (`12.3x`) and other decimals within 2% (or 2e-3); integers exactly
below 1000 (layers, heads, positions, counts) and within 1% above (ranks among near-ties). So a
committed notebook whose numbers the code no longer produces fails.

Exercises ship unanswered: a student cell (`<ex>-student`) holds `answer = ...`, its check says
nothing is written yet, and the worked answer sits in a collapsed markdown cell (`<ex>-answer`,
tagged solution). `execute(..., solved=True)` puts each worked answer into its student cell first,
so the tests run the worked answers; the exercise cells themselves (and an `<ex>-try` cell that
runs the answer further) are not compared with the shipped outputs.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

# the lessons: numbered notebooks with exercises (05_sweeps, the Dask one, is tested on its own)
LESSONS = [
    "01_walkthrough",
    "02_attention",
    "03_logit_lens",
    "04_kernel_variants",
    "06_prefill_decode",
    "07_sampling",
    "08_quantization",
    "09_mixture_of_experts",
    "10_recurrent_state",
    "11_write_a_kernel",
    "12_serving_paths",
    "13_latent_attention",
]

ROOT = Path(__file__).resolve().parents[1]
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MAX_BYTES = 2 * 1024 * 1024
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_UNIT = re.compile(r"\s?(tok/s|it/s|[GMK]i?B/s|GFLOP/s|(?:ms|µs|us|ns|s|min)(?![\w-])|x\b|×|[GMK]i?B\b|bytes\b|%)")
_URL = re.compile(r"\b(?:https?|tcp|inproc)://\S+|\b\d+\.\d+\.\d+\.\d+(?::\d+)?")  # addresses, ports
_WORKED = re.compile(r"```python\n(.*?)\n```", re.DOTALL)
_HERE = re.compile(r"\b(?:127\.0\.0\.1|localhost)(?::\d+)?|\btcp://\d+\.\d+\.\d+\.\d+|(?<![\w.])/tmp/[\w.+-]+")
_PATH = re.compile(r"(?<![\w.])/[\w.+-]+(?:/[\w.+-]+)+")  # temporary dirs and the checkout differ per run
_PROGRESS = re.compile(r"^\S.*:\s+\d+%\|.*$", re.MULTILINE)  # a tqdm line in a terminal-style stream


def execute(
    name: str, cwd: Path = ROOT, timeout: int = 900, kernel: str = "python3", solved: bool = True, after: str = ""
) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode, float]:
    """(committed, executed, seconds) for notebooks/<name>.ipynb, run in a real kernel from `cwd`;
    `solved`: with the worked answers in the student cells. `after`: code run in the same kernel
    once the notebook has run, as one more cell (id "after") at the end of the executed copy."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    committed = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    if solved:
        with_worked_answers(nb)
    if after:
        nb.cells.append(nbformat.v4.new_code_cell(after, id="after"))
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(cwd)}}).execute()
    return committed, nb, time.perf_counter() - t0


# what a case notebook's own run_case reported, {name: {"report": to_dict(), "text": text()}}:
# test_cases checks these rather than running each case a second time
CASE_REPORTS: dict[str, dict] = {}


_EXECUTED: dict[str, tuple] = {}


def executed(name: str) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    """(committed, executed with the worked answers) of a notebook, run once per test session: the
    lesson tests and the browser test read the same kernel run, whichever ran it first."""
    if name not in _EXECUTED:
        committed, nb, seconds = execute(name)
        print(f"{name}: {seconds:.1f} s")
        _EXECUTED[name] = (committed, nb)
    return _EXECUTED[name]


def ran_elsewhere(name: str, nb: nbformat.NotebookNode) -> None:
    """A run of the notebook, worked answers in, by another real kernel (the browser test's, saved
    by JupyterLab): `executed(name)` reads it rather than running the lesson a second time."""
    if name not in _EXECUTED:
        _EXECUTED[name] = (nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4), nb)


def with_worked_answers(nb) -> int:
    """Each exercise's worked answer (the code in its collapsed `<ex>-answer` cell) put into its
    `<ex>-student` cell; how many."""
    cells = {c.id: c for c in nb.cells}
    n = 0
    for c in nb.cells:
        if c.id.endswith("-answer") and "solution" in c.metadata.get("tags", []):
            student = cells[c.id[: -len("-answer")] + "-student"]
            code = _WORKED.search(c.source) if c.cell_type == "markdown" else None
            assert code, f"{c.id}: no ```python block in the worked answer"
            student.source = code.group(1)
            n += 1
    return n


def is_exercise_cell(cell) -> bool:
    """A student's cell, its check, or a cell that tries the answer further (`<ex>-try`: lesson 11's
    bench of the student's kernels): what a worked answer changes."""
    return cell.id.endswith(("-student", "-check", "-try"))


def cell_text(cell) -> str:
    """A cell's plain text output, without progress bars."""
    shown = [o for o in cell.get("outputs", []) if not _is_progress(o)]
    return "\n".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in shown)


def _is_progress(output) -> bool:
    data = output.get("data", {})
    return WIDGET in data and "%|" in str(data.get("text/plain", ""))


def errors(nb) -> list[str]:
    return [f"{c.id}: {o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]  # fmt: skip


def _signature(cell, text: bool) -> list[tuple]:
    """What a cell showed, comparable across runs: each output's kind, its MIME types, and (with
    `text`) its plain text with numbers masked. Progress bars are left out (they show on first use)."""
    sig = []
    shown = [o for o in cell.get("outputs", []) if not _is_progress(o)]  # a tqdm widget, between prints too
    for o in _merged_streams(shown):
        data = o.get("data", {})
        body = o.get("text", "") if o.output_type == "stream" else str(data.get("text/plain", ""))
        body = _PROGRESS.sub("", body).strip()
        if o.output_type == "stream" and not body:
            continue
        if WIDGET in data:
            body = body.split("(", 1)[0]  # the widget's class; its children's reprs hold model ids
        body = _URL.sub("<address>", _PATH.sub("<path>", body))
        nums = tuple((float(m.group()), number_kind(m, body)) for m in _NUMBER.finditer(body)) if text else ()
        sig.append((o.output_type, tuple(sorted(data)), _NUMBER.sub("#", body) if text else "", nums))
    return sig


def number_kind(m: re.Match, text: str) -> str:
    """What a number in an output is, from its unit or its form: how closely two runs must agree."""
    unit = _UNIT.match(text, m.end())
    if unit:
        u = unit.group(1)
        if u in ("%",):
            return "percent"
        if u.endswith("B") or u == "bytes":
            return "size"
        if u in ("x", "×"):  # of errors or sizes; a speed ratio reads "2.1x the time of ..."
            return "timing" if text.startswith(" the time", unit.end()) else "ratio"
        return "timing"  # durations and rates
    if "e" in m.group().lower():
        return "error"
    return "decimal" if "." in m.group() else "integer"


def numbers_agree(a: float, b: float, kind: str) -> bool:
    """Two runs' values of one number of this kind agree (see the module's docstring)."""
    if kind == "timing" or a == b:
        return True
    if kind == "size":
        return abs(a - b) <= 0.05 * max(abs(a), abs(b))
    if kind == "percent":
        return abs(a - b) <= 2.0
    if kind == "error":
        small = 1e-12
        if abs(a) <= small or abs(b) <= small:
            return abs(a) <= 1e-9 and abs(b) <= 1e-9
        return (a > 0) == (b > 0) and abs(math.log10(abs(a)) - math.log10(abs(b))) <= 0.5
    if kind in ("decimal", "ratio"):
        return abs(a - b) <= max(2e-3, 0.02 * max(abs(a), abs(b)))
    # integers: exact below 1000, within 1% above
    return max(abs(a), abs(b)) >= 1000 and abs(a - b) <= 0.01 * max(abs(a), abs(b))


def _merged_streams(outputs: list) -> list:
    """Consecutive stream outputs of one stream as one (the kernel splits prints as it flushes)."""
    merged: list = []
    for o in outputs:
        if o.output_type == "stream" and merged and merged[-1].output_type == "stream" and merged[-1].name == o.name:
            merged[-1] = nbformat.from_dict({**merged[-1], "text": merged[-1].text + o.text})
        else:
            merged.append(o)
    return merged


def assert_outputs_match(committed, executed, text: bool = True) -> None:
    """Every code cell shows the same kinds of output (and text) as when the notebook was committed."""
    ran = {c.id: c for c in executed.cells if c.cell_type == "code"}
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert any(c.outputs for c in code), "the notebook was committed without its outputs"
    for cell in code:
        if is_exercise_cell(cell):
            continue  # shipped unanswered, run with the worked answer
        want, got = _signature(cell, text), _signature(ran[cell.id], text)
        texts = [w[:3] for w in want], [g[:3] for g in got]
        assert texts[0] == texts[1], f"cell {cell.id}: committed outputs do not match its code any more:\n{texts}"
        for w, g in zip(want, got):
            off = [(x, y, kind) for (x, kind), (y, _) in zip(w[3], g[3]) if not numbers_agree(x, y, kind)]
            assert not off, f"cell {cell.id}: committed numbers drifted (committed, now, kind): {off[:8]}"


def assert_shippable(name: str) -> None:
    """Under 2 MB, no saved progress bar ("0%| 0/234" on GitHub), no local path, address or temporary
    folder, and widget state saved when a cell shows a widget (a fresh open renders it)."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    assert path.stat().st_size < MAX_BYTES, f"{name}: {path.stat().st_size} bytes"
    nb = nbformat.read(path, as_version=4)
    bars = [c.id for c in nb.cells if c.cell_type == "code" for o in c.outputs if _is_progress(o)]
    assert not bars, f"{name}: saved progress bars in cells {bars} (scripts/run_notebooks.py drops them)"
    text = path.read_text()
    for local in (str(ROOT), str(Path.home()), "/site-packages/"):
        assert local not in text, f"{name}: a local path ({local}) in the saved outputs"
    here = _HERE.search(text)  # an address or a temporary folder means nothing on another machine
    assert here is None, f"{name}: a local address or temporary path in the saved outputs: {here.group()}"
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if WIDGET in o.get("data", {})]
    if views:
        state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        missing = [v["data"][WIDGET]["model_id"] for v in views if v["data"][WIDGET]["model_id"] not in state]
        assert not missing, f"{name}: widget views without saved state: {missing[:3]}"
