"""Execute notebooks in place, in a real kernel, keeping their widget state: how the committed
notebooks get their outputs (tests/notebook_outputs.py checks them against their code).

    .venv/bin/python scripts/run_notebooks.py 04_kernel_variants [NAME ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def run(name: str) -> float:
    path = ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=900, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(ROOT)}}).execute()  # fmt: skip
    nbformat.write(nb, path)
    return time.perf_counter() - t0


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {run(name):.1f} s")
