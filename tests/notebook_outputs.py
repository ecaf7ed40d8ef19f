"""Committed notebooks carry their outputs; these helpers check that the outputs still come from
the code beside them: a notebook is executed again and each code cell's outputs are compared with
the committed ones by kind and text, never pixels (numbers are masked: timings and addresses vary)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MAX_BYTES = 2 * 1024 * 1024
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_PATH = re.compile(r"(?<![\w.])/[\w.+-]+(?:/[\w.+-]+)+")  # temporary dirs and the checkout differ per run
_PROGRESS = re.compile(r"^\S.*:\s+\d+%\|.*$", re.MULTILINE)  # a tqdm line in a terminal-style stream


def execute(
    name: str, cwd: Path = ROOT, timeout: int = 900, kernel: str = "python3"
) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode, float]:
    """(committed, executed, seconds) for notebooks/<name>.ipynb, run in a real kernel from `cwd`."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    committed = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(cwd)}}).execute()
    return committed, nb, time.perf_counter() - t0


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
        sig.append((o.output_type, tuple(sorted(data)), _NUMBER.sub("#", _PATH.sub("<path>", body)) if text else ""))
    return sig


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
        want, got = _signature(cell, text), _signature(ran[cell.id], text)
        assert want == got, f"cell {cell.id}: committed outputs do not match its code any more:\n{want}\n!=\n{got}"


def assert_shippable(name: str) -> None:
    """Under 2 MB, no saved progress bar ("0%| 0/234" on GitHub), no local path, and widget state
    saved when a cell shows a widget (a fresh open renders it)."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    assert path.stat().st_size < MAX_BYTES, f"{name}: {path.stat().st_size} bytes"
    nb = nbformat.read(path, as_version=4)
    bars = [c.id for c in nb.cells if c.cell_type == "code" for o in c.outputs if _is_progress(o)]
    assert not bars, f"{name}: saved progress bars in cells {bars} (scripts/run_notebooks.py drops them)"
    text = path.read_text()
    for local in (str(ROOT), str(Path.home()), "/site-packages/"):
        assert local not in text, f"{name}: a local path ({local}) in the saved outputs"
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if WIDGET in o.get("data", {})]
    if views:
        state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        missing = [v["data"][WIDGET]["model_id"] for v in views if v["data"][WIDGET]["model_id"] not in state]
        assert not missing, f"{name}: widget views without saved state: {missing[:3]}"
