"""Notebooks run top to bottom in a real Jupyter kernel (nbclient), with no cell errors."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
WIDGET = "application/vnd.jupyter.widget-view+json"


def cell_text(cell) -> str:
    return "\n".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.slow
def test_walkthrough_runs_in_a_real_kernel(tmp_path, record_property):
    nb = nbformat.read(ROOT / "notebooks" / "01_walkthrough.ipynb", as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    seconds = time.perf_counter() - t0
    record_property("walkthrough_seconds", round(seconds, 1))
    code = [c for c in nb.cells if c.cell_type == "code"]
    cells = {c.id: c for c in code}
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(cell_text(c) for c in code)
    assert "' blue'" in text and "' a'" in text  # run.top(5) of the sky prompt
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6, "the figures should render inline"
    widgets = [c.id for c in code if any(WIDGET in o.get("data", {}) for o in c.get("outputs", []))]
    assert {"f6fcc816", "attn-explorer", "variants", "stepper"} <= set(widgets), widgets

    # the rich Run display: tokens as pieces, the top tokens, nothing flagged on a correct pass
    html = "".join(o["data"].get("text/html", "") for o in cells["run-glance"].outputs if "data" in o)
    assert "labkit-run" in html and "&lt;bos&gt;" in html and " sky" in html and "&#x27; blue&#x27;" in html
    assert "no NaN, inf or unwritten" in html
    shown = "".join(o["data"].get("text/html", "") for o in cells["array-show"].outputs if "data" in o)
    assert shown.count("labkit-array") == 2 and "blk.17.resid_out" in shown and "masked (-inf)" in shown

    # switching rope to normal pairs moves the first divergence to blk.0.q_rope, and only re-runs from there
    rope = cell_text(cells["variants-rope"])
    assert "first divergence: blk.0.q_rope" in rope and "recomputed from blk.0.q_rope" in rope, rope
    assert any("image/png" in o.get("data", {}) for o in cells["variants-rope"].outputs)
    assert "first divergence: None" in cell_text(cells["variants-back"])

    # debug mode: a correct pass leaves nothing unwritten; the faulty lm_head leaves logits rows
    assert "unwritten elements in the correct pass: 0" in cell_text(cells["debug-clean"])
    debug = cell_text(cells["debug-lm-head"])
    assert "unwritten per stage: {'logits': " in debug and "unwritten logits rows" in debug, debug
    debug_html = "".join(o["data"].get("text/html", "") for o in cells["debug-lm-head"].outputs if "data" in o)
    assert "first: <code>logits</code>" in debug_html and "unwritten=" in debug_html

    # the generation cell stays last (the browser test waits for it)
    assert "lab.generate" in code[-1].source and cell_text(code[-1]).strip()


@pytest.mark.slow
def test_diagnose_your_engine_localizes_llamacpps_corrupted_tensor(tmp_path):
    """The notebook dumps llama.cpp on a corrupted copy, loads the dumps as they are, and finds
    blk.3.ffn_up both from the tensors and from the weights; the intact dump passes."""
    nb = nbformat.read(ROOT / "notebooks" / "diagnose_your_engine.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.get("outputs", []) if o.output_type == "error"]
    cells = {c.id: cell_text(c) for c in code}
    assert cells["compare-broken"].startswith("first divergence: blk.3.ffn_up at position 0")
    assert "int8-activations table" in cells["compare-broken"]
    assert "no divergence" in cells["compare-good"]
    assert "first differing tensor (graph order): blk.3.ffn_up.weight" in cells["diff-weights"]
    assert "holds positions (5,)" in cells["load-run"]
    saved = next(c for c in code if c.id == "save-load")  # the reopened run, in the stage stepper
    assert any(WIDGET in o.get("data", {}) for o in saved.get("outputs", []))


@pytest.mark.slow
def test_sweeps_notebook_runs_on_a_local_cluster():
    """05_sweeps: a Dask LocalCluster of 2 processes sweeps SmolLM2, plots, and reduces a prompt."""
    nb = nbformat.read(ROOT / "notebooks" / "05_sweeps.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    code = {c.id: c for c in nb.cells if c.cell_type == "code"}
    assert not [o for c in code.values() for o in c.get("outputs", []) if o.output_type == "error"]
    assert "dashboard: http://" in cell_text(code["cluster"])
    plots = cell_text(code["plots"])
    assert "never diverge:" in plots and "rope=normal_pairs" in plots and "attn_scores=decode_uses_prefill" in plots
    assert "rmsnorm=scale_clamp" not in plots.split("never diverge:")[1]
    assert any("image/png" in o.get("data", {}) for o in code["plots"].outputs)
    red = cell_text(code["reduce"])
    assert "64 -> 1 token in" in red and "(attn_norm)" in red, red  # SmolLM2 adds no BOS: one token is enough
