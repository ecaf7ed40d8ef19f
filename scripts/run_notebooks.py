"""Execute notebooks in place, in a real kernel, keeping their widget state: how the committed
notebooks get their outputs (tests/notebook_outputs.py checks them against their code).

Progress bars are dropped from the saved outputs: on GitHub a saved bar reads "0%| 0/234", and
its text says nothing about the lesson.

    .venv/bin/python scripts/run_notebooks.py 04_kernel_variants [NAME ...]
    .venv/bin/python scripts/run_notebooks.py --strip-only NAME ...   (drop saved bars, run nothing)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def is_progress(output) -> bool:
    """A tqdm bar's output: a widget view whose text reads like "45%|████ | 9/20"."""
    data = output.get("data", {})
    return WIDGET in data and "%|" in str(data.get("text/plain", ""))


def strip_progress(nb) -> int:
    """Drop the saved progress bars and their widget state; how many were dropped."""
    gone = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            gone |= {o["data"][WIDGET]["model_id"] for o in cell.outputs if is_progress(o)}
            cell.outputs = [o for o in cell.outputs if not is_progress(o)]
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model_id in gone:  # the bar's own model; its parts stay (tiny, and harmless)
        state.pop(model_id, None)
    return len(gone)


def run(name: str, execute: bool = True) -> float:
    path = ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    if execute:
        cwd = ROOT / "notebooks" if name.startswith("case_") else ROOT  # where the tests run each one
        NotebookClient(nb, timeout=900, kernel_name="python3", store_widget_state=True,
                       resources={"metadata": {"path": str(cwd)}}).execute()  # fmt: skip
    strip_progress(nb)
    nbformat.write(nb, path)
    return time.perf_counter() - t0


if __name__ == "__main__":
    strip_only = "--strip-only" in sys.argv
    for name in [a for a in sys.argv[1:] if a != "--strip-only"]:
        print(f"{name}: {run(name, execute=not strip_only):.1f} s")
