"""Figures and widgets over Runs. Presentation only: no computation, and no import of the lab,
the GPU or the model (data flows file → model → GPU executor → captures → compare and viz).

    from labkit.viz import figures, widgets       # plotly/matplotlib figures; ipywidgets explorers
    from labkit.viz import static                 # the matplotlib twin of every figure (ax=)
    from labkit.viz import show, array_summary    # one capture at a glance (treescope-like)
    from labkit.viz import stage_explorer, attention_explorer, variant_switcher, stage_stepper

ipywidgets is imported on first use of a widget, so `figures` stays light.
"""

from __future__ import annotations

from labkit.viz.figures import ArraySummary, array_summary, show

_WIDGETS = ("stage_explorer", "attention_explorer", "variant_switcher", "stage_stepper")

__all__ = ["ArraySummary", "array_summary", "show", *_WIDGETS]


def __getattr__(name: str):
    if name in _WIDGETS:
        from labkit.viz import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module 'labkit.viz' has no attribute {name!r}")
