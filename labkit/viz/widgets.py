"""ipywidgets explorers over a Run: pick a layer and a stage, see stats and a histogram."""

from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display

from labkit.captures import Run
from labkit.compare import stage_kind
from labkit.viz import figures


def stage_explorer(run: Run, n_layers: int) -> W.Widget:
    """Layer slider × stage-kind dropdown × position slider → stats line and histogram."""
    kinds = sorted({stage_kind(s) for s in run.stages if s.startswith("blk.0.") and s in run.captures})
    layer = W.IntSlider(value=0, min=0, max=n_layers - 1, description="layer")
    kind = W.Dropdown(options=kinds, value="resid_out" if "resid_out" in kinds else kinds[0], description="stage")
    pos = W.IntSlider(value=len(run.tokens) - 1, min=0, max=len(run.tokens) - 1, description="position")
    out = W.Output()

    def redraw(*_):
        name = f"blk.{layer.value}.{kind.value}"
        with out:
            out.clear_output(wait=True)
            print(run.stats(name, pos=pos.value))
            fig, ax = plt.subplots(figsize=(6, 2.6))
            figures.histogram(run, name, pos=pos.value, ax=ax)
            plt.show()

    for w in (layer, kind, pos):
        w.observe(redraw, names="value")
    redraw()
    box = W.VBox([W.HBox([layer, kind, pos]), out])
    display(box)
    return box
