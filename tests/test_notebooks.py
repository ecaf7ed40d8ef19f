"""Notebooks run top to bottom in a real Jupyter kernel (nbclient), with no cell errors, and their
committed outputs still match their code (the lessons are in test_lessons.py)."""

from __future__ import annotations

import pytest
from notebook_outputs import WIDGET, assert_outputs_match, assert_shippable, cell_text, execute


@pytest.mark.slow
def test_diagnose_your_engine_localizes_llamacpps_corrupted_tensor(tmp_path):
    """The notebook dumps llama.cpp on a corrupted copy, loads the dumps as they are, and finds
    blk.3.ffn_up both from the tensors and from the weights; the intact dump passes."""
    committed, nb, _ = execute("diagnose_your_engine")
    assert_outputs_match(committed, nb)
    assert_shippable("diagnose_your_engine")
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
    committed, nb, _ = execute("05_sweeps")
    assert_outputs_match(committed, nb, text=False)  # worker addresses, timings and throughput vary
    assert_shippable("05_sweeps")
    code = {c.id: c for c in nb.cells if c.cell_type == "code"}
    assert not [o for c in code.values() for o in c.get("outputs", []) if o.output_type == "error"]
    assert "2 worker processes" in cell_text(code["cluster"])
    assert "tasks per worker:" in cell_text(code["sweep"])
    plots = cell_text(code["plots"])
    assert "never diverge:" in plots and "rope=normal_pairs" in plots and "attn_scores=decode_uses_prefill" in plots
    assert "rmsnorm=scale_clamp" not in plots.split("never diverge:")[1]
    assert any("image/png" in o.get("data", {}) for o in code["plots"].outputs)
    red = cell_text(code["reduce"])
    assert "64 -> 1 token in" in red and "(attn_norm)" in red, red  # SmolLM2 adds no BOS: one token is enough
    # the window fault depends on the prompt's length: it shows from window + 1 = 7 tokens, and the
    # reduction of 32 tokens keeps 7 (any 7), diverging in layer 0's scores
    lengths = cell_text(code["window-sweep"])
    rows = [line.split() for line in lengths.splitlines()[1:] if line.strip()]
    diverged = {int(r[1]): r[2] != "NaN" for r in rows}
    assert diverged == {4: False, 6: False, 7: True, 8: True, 16: True, 32: True}, lengths
    red_w = cell_text(code["window-reduce"])
    assert "32 -> 7 tokens" in red_w and "blk.0.attn_scores" in red_w, red_w
    checks = [cell_text(c) for i, c in code.items() if i.endswith("-check")]
    assert len(checks) == 2 and all(t.startswith("✓") for t in checks), checks
