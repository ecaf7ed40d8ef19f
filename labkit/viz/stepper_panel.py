"""The stage stepper: every captured stage of a pass, in graph order, one at a time (labkit.viz.widgets
re-exports it)."""

from __future__ import annotations

import asyncio
import html

import ipywidgets as W
import numpy as np

from labkit.attribution import Attribution
from labkit.captures import Run
from labkit.compare import compare
from labkit.viz.figures import explanation_html
from labkit.viz.panel import Panel, Summaries, message


class StageStepper(Panel):
    """Every captured stage in graph order behind a slider and ◀ ▶ buttons; each shows its
    array summary (stats, histogram, heat map per position), given a reference its NMSE, and
    given an attribution (labkit.attribute) its own error beside it."""

    css_class = "labkit-stage-stepper"

    def __init__(self, run: Run, reference: Run | None = None, attribution: Attribution | None = None):
        self.run, self.attribution = run, attribution
        self.summaries = Summaries(run)
        self.names = [s for s in run.stages if s in run]
        self.comparison = compare(run, reference) if reference is not None else None
        self.index = W.IntSlider(value=0, min=0, max=len(self.names) - 1, description="stage", readout=False)
        self.index.layout.width = "420px"
        # play/pause on the kernel side: pausing keeps the stage (ipywidgets' Play has a stop that
        # rewinds to the first stage), and the speed is a control of its own
        self.play = W.ToggleButton(value=False, description="play", icon="play", layout=W.Layout(width="80px"))
        self.speed = W.FloatLogSlider(
            value=4.0, base=10, min=-0.5, max=1.5, description="stages/s", readout_format=".1f"
        )
        self.speed.layout.width = "260px"
        self.play.observe(self._toggled, names="value")
        self._task = None
        self.prev = W.Button(description="◀", layout=W.Layout(width="40px"))
        self.next = W.Button(description="▶", layout=W.Layout(width="40px"))
        self.prev.on_click(lambda _: self.step(-1))
        self.next.on_click(lambda _: self.step(+1))
        self.title = W.HTML()
        self.explanation = W.HTML()
        self.body = W.HTML()
        self.index.observe(self.refresh, names="value")
        controls = W.HBox([self.play, self.prev, self.index, self.next, self.speed])
        super().__init__([controls, self.title, self.explanation, self.body])

    def step(self, delta: int) -> None:
        self.index.value = int(np.clip(self.index.value + delta, 0, len(self.names) - 1))

    def tick(self) -> bool:
        """One step of play: the next stage; False (and paused) at the last one."""
        if self.index.value >= len(self.names) - 1:
            self.play.value = False
            return False
        self.step(+1)
        return True

    def _toggled(self, change) -> None:
        self.play.description, self.play.icon = ("pause", "pause") if change["new"] else ("play", "play")
        if change["new"] and self.index.value >= len(self.names) - 1:
            self.index.value = 0  # play from the end starts over
        if change["new"]:
            try:
                loop = asyncio.get_running_loop()  # the kernel's loop (none outside Jupyter: drive tick())
            except RuntimeError:
                return
            self._task = loop.create_task(self._play())

    async def _play(self) -> None:
        while self.play.value and self.tick():
            await asyncio.sleep(1.0 / self.speed.value)

    def go(self, name: str) -> None:
        self.index.value = self.names.index(name)

    @property
    def stage(self) -> str:
        return self.names[self.index.value]

    def refresh(self, *_) -> None:
        name = self.stage
        verdict = ""
        if self.comparison is not None and name in self.comparison.missing:
            verdict = " · not in the reference"
        elif self.comparison is not None:
            r = self.comparison.row(name)
            color = "#2a7" if r.passed else "#c00"
            mark = "ok" if r.passed else "FAIL " + r.reason
            verdict = f" · <span style='color:{color}'>nmse {r.nmse:.2e} ({mark})</span>"
        verdict += _local_html(self.attribution, name)
        self.title.value = message(
            f"{self.index.value + 1}/{len(self.names)} <code>{html.escape(name)}</code>{verdict}"
        )
        self.explanation.value = explanation_html(self.run, name)
        self.body.value = self.summaries(name)


def _local_html(att: Attribution | None, name: str) -> str:
    """` · local 1.0e-06 (band 1.1e-14, inherited 2.0e-13): GUILTY` for a stage the attribution holds."""
    row = next((r for r in att.rows if r.stage == name), None) if att is not None else None
    if row is None:
        return ""
    color, mark = ("#c00", "GUILTY") if row.guilty else ("#2a7", "own error within its band")
    where = f" for {html.escape(row.name)}" if len(row.segment) > 1 else ""
    return (f" · <span style='color:{color}'>local {row.local:.2e}{where} (band {row.band:.1e}, "
            f"inherited {row.inherited:.1e}): {mark}</span>")  # fmt: skip


def stage_stepper(run: Run, reference: Run | None = None, attribution: Attribution | None = None) -> StageStepper:
    """Step through every captured stage of a run (◀ ▶, a slider, or play), each shown as an
    array summary; with a reference, each stage's NMSE and pass/fail; with an attribution
    (labkit.attribute), each stage's own error, band and verdict beside it."""
    return StageStepper(run, reference, attribution)
