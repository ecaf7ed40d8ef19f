"""Notebooks run top to bottom in a real Jupyter kernel (nbclient), with no cell errors."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_walkthrough_runs_in_a_real_kernel(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / "01_walkthrough.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in outputs)
    assert "' blue'" in text and "' a'" in text  # run.top(5) of the sky prompt
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4, "the figures should render inline"
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, "the stage explorer should display a widget"
