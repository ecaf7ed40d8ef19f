"""What every labkit widget is made of: a panel that draws itself and shows a still without a widget
manager, PNG figures outside pyplot, and the small HTML pieces the explorers share."""

from __future__ import annotations

import base64
import html
import io

import ipywidgets as W
from matplotlib.figure import Figure

from labkit.captures import Run
from labkit.viz import figures

FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:12px"


def png(fig: Figure, dpi: int = 90) -> bytes:
    """A Figure (not registered with pyplot, so nothing else displays it) as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def axes(w: float, h: float):
    fig = Figure(figsize=(w, h))
    return fig, fig.add_subplot()


def token_pieces(run: Run) -> list[str]:
    piece = run.piece or str
    return [piece(int(t)) for t in run.tokens]


def message(text: str, color: str = "#666") -> str:
    return f"<div style='{FONT};color:{color}'>{text}</div>"


class Panel(W.VBox):
    """An explorer: its children in a column (figures at their own size, not stretched), marked with
    `css_class`, and drawn once on creation by `refresh()`."""

    css_class = ""

    def __init__(self, children: list[W.Widget]):
        super().__init__(children)
        self.add_class(self.css_class)
        self.layout.align_items = "flex-start"
        self.refresh()

    def refresh(self, *_) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: run the notebook to use it; its last view is shown as a still>"

    def _repr_mimebundle_(self, **kwargs):
        """The widget, plus a still of what it shows now (HTML): a viewer without the widget manager
        (GitHub, an untrusted notebook) shows the still instead of the widget's repr."""
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/html"] = f"<div class='{self.css_class}-still'>{still_html(self)}</div>"
        return bundle


def still_html(w: W.Widget) -> str:
    """A widget tree as static HTML: HTML children as they are, images inline, controls as a caption."""
    if isinstance(w, W.HTML):
        return w.value
    if isinstance(w, W.Image):
        return f"<img src='data:image/png;base64,{base64.b64encode(w.value).decode()}'/>" if w.value else ""
    if isinstance(w, W.Box):
        return "".join(still_html(c) for c in w.children)
    if isinstance(w, W.Button):
        return ""
    if isinstance(w, W.ValueWidget) and getattr(w, "description", ""):
        text = f"{w.description}: {w.value}"
        return f"<span style='{FONT};margin-right:12px'>{html.escape(text)}</span>"
    return ""


class Summaries:
    """figures.array_summary HTML of each stage of one run, built on first view: it does not depend
    on the position a widget shows, so moving a slider does not rebuild it."""

    def __init__(self, run: Run):
        self.run = run
        self._html: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self._html:
            self._html[name] = figures.array_summary(self.run, name)._repr_html_()
        return self._html[name]
