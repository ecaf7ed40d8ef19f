"""ipywidgets explorers over Runs: stages, attention maps, kernel variants, the pass stage by stage.

Presentation only: every number comes from a Run. A widget that needs a new Run (the variant
switcher) calls back into the notebook (`rerun(selection) -> Run`), so nothing here imports the
lab, the GPU or the model. Figures are drawn on matplotlib Figures outside pyplot and shown as PNG
Image widgets (no Output-widget capture): the widgets behave the same with or without a kernel,
and every explorer exposes its controls as attributes, so a notebook or a test can drive it.

    stage_explorer(run, n_layers)                       stage × layer × position → what it is, stats, histogram
    attention_explorer(run, n_layers, labels)           layer × head (× all heads) → attention map
    variant_switcher(families, rerun, reference)        one dropdown per op family → re-run, compare
    stage_stepper(run, reference=None)                  every captured stage in order, with its NMSE
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping

import ipywidgets as W
import numpy as np

from labkit.captures import TOP_LEVEL_KINDS, Run, TopToken, graph_position
from labkit.compare import Comparison, compare, stage_kind
from labkit.viz import static
from labkit.viz.figures import explanation_html
from labkit.viz.panel import FONT, Panel, Summaries, axes, message, png, token_pieces
from labkit.viz.stepper_panel import StageStepper, stage_stepper

__all__ = ["AttentionExplorer", "StageExplorer", "StageStepper", "VariantSwitcher", "attention_explorer",
           "stage_explorer", "stage_stepper", "variant_switcher"]  # fmt: skip
Rerun = Callable[[dict[str, str]], Run]


# ----- stages


class StageExplorer(Panel):
    """Stage dropdown in pass order (embed, each layer's stages, output_norm, logits) × layer
    slider × position slider → what the stage computes, its stats line and histogram at that
    position, and the whole stage as a heat map (one row per position, see figures.array_summary)."""

    css_class = "labkit-stage-explorer"

    def __init__(self, run: Run, n_layers: int):
        self.run = run
        self.labels = token_pieces(run)
        self.summaries = Summaries(run)
        kinds = pass_order_kinds(run)
        if not kinds:
            raise ValueError("the run captured no stage: nothing to explore")
        T = len(run.tokens)
        self.layer = W.IntSlider(value=0, min=0, max=n_layers - 1, description="layer")
        self.kind = W.Dropdown(
            options=kinds, value="resid_out" if "resid_out" in kinds else kinds[0], description="stage"
        )
        self.pos = W.IntSlider(value=T - 1, min=0, max=T - 1, description="position")
        self.explanation = W.HTML()
        self.stats = W.HTML()
        self.image = W.Image(format="png")
        self.summary = W.HTML()
        for w in (self.layer, self.kind, self.pos):
            w.observe(self.refresh, names="value")
        controls = W.HBox([self.kind, self.layer, self.pos])
        super().__init__([controls, self.explanation, self.stats, self.image, self.summary])

    @property
    def stage(self) -> str:
        kind = self.kind.value
        return kind if kind in TOP_LEVEL_KINDS else f"blk.{self.layer.value}.{kind}"

    def refresh(self, *_) -> None:
        name, pos = self.stage, self.pos.value
        self.layer.disabled = name in TOP_LEVEL_KINDS  # embed, output_norm, logits: no layer
        self.explanation.value = explanation_html(self.run, name)
        if name not in self.run:
            self.stats.value = message(f"{name} was not captured in this run", "#c00")
            self.image.value, self.summary.value = b"", ""
            return
        if pos not in self.run.rows(name):  # an engine's dump that holds the last position only
            self.stats.value = message(f"{name} holds position(s) {list(self.run.rows(name))} only", "#c00")
            self.image.value, self.summary.value = b"", self.summaries(name)
            return
        piece = self.labels[pos]
        self.stats.value = (
            message(f"position {pos} = {html.escape(repr(piece))}") + self.run.stats(name, pos=pos)._repr_html_()
        )
        fig, ax = axes(6, 2.6)
        static.histogram(self.run, name, pos=pos, ax=ax)
        self.image.value = png(fig)
        self.summary.value = self.summaries(name)  # the whole stage: the same at every position


def pass_order_kinds(run: Run) -> list[str]:
    """The stage kinds a run captured, in the order the pass computes them: embed, the layers'
    kinds, output_norm, logits."""
    keys = {}
    for s in run.captures:
        g = graph_position(s)
        if g is not None:
            keys[stage_kind(s)] = (g[0], g[2])
    return sorted(keys, key=keys.get)


def stage_explorer(run: Run, n_layers: int) -> StageExplorer:
    """Layer slider × stage-kind dropdown × position slider → stats line and histogram.
    Returns the widget (the last expression of a cell displays it)."""
    return StageExplorer(run, n_layers)


# ----- attention


class AttentionExplorer(Panel):
    """Layer and head sliders → one head's attention map (probabilities, or the masked scores), or
    every head of the layer side by side; a query slider lists what that query attends to most."""

    css_class = "labkit-attention-explorer"

    def __init__(self, run: Run, n_layers: int, labels: list[str] | None = None):
        self.run = run
        self.labels = labels if labels is not None else token_pieces(run)
        maps = [s for s in run.stages if s.endswith("attn_probs") and s in run]
        n_heads = run[maps[0]].shape[0] if maps else 1
        T = len(run.tokens)
        self.layer = W.IntSlider(value=0, min=0, max=n_layers - 1, description="layer")
        self.head = W.IntSlider(value=0, min=0, max=max(n_heads - 1, 0), description="head")
        self.values = W.ToggleButtons(options=["probs", "scores"], value="probs", description="show")
        self.values.style.button_width = "70px"
        self.all_heads = W.Checkbox(value=False, description="all heads", indent=False)
        self.query = W.IntSlider(value=T - 1, min=0, max=T - 1, description="query")
        self.image = W.Image(format="png")
        self.attends = W.HTML()
        self.explanation = W.HTML()
        for w in (self.layer, self.head, self.values, self.all_heads):
            w.observe(self.refresh, names="value")
        self.query.observe(self._show_attends, names="value")  # the map does not depend on the query
        controls = W.VBox([W.HBox([self.layer, self.head, self.all_heads]), W.HBox([self.values, self.query])])
        super().__init__([controls, self.explanation, self.image, self.attends])

    @property
    def stage(self) -> str:
        return f"blk.{self.layer.value}.attn_{self.values.value}"

    def refresh(self, *_) -> None:
        L, h, probs = self.layer.value, self.head.value, self.values.value == "probs"
        name = self.stage
        self.explanation.value = explanation_html(self.run, name)
        if name not in self.run:
            self.image.value = b""
            self.attends.value = message(
                f"{name} was not captured: a fused attention variant (streaming, tiled) never materializes "
                "the attention map, or a names filter left it out",
                "#c00",
            )
            return
        self.head.disabled = self.all_heads.value
        if self.all_heads.value:
            fig = static.attention_grid(self.run, L, probs=probs, labels=self.labels)
        else:
            size = min(3.0 + 0.25 * len(self.labels), 9.0)
            fig, ax = axes(size, size)
            static.attention_map(self.run, L, head=h, probs=probs, ax=ax, labels=self.labels)
        self.image.value = png(fig)
        self._show_attends()

    def _show_attends(self, *_) -> None:
        if self.stage in self.run:  # otherwise `attends` says why there is no map
            self.attends.value = self._top_keys(self.layer.value, self.head.value)

    def _top_keys(self, layer: int, head: int, k: int = 4) -> str:
        name = f"blk.{layer}.attn_probs"
        if name not in self.run:
            return ""
        q = self.query.value
        row = np.asarray(self.run.head(name, head)[q], dtype=np.float64)
        order = np.argsort(-np.nan_to_num(row, nan=-1.0))[:k]
        labels = self.labels
        offset = row.shape[0] - len(labels)  # keys before this pass (KV cache) have no label here
        parts = [
            f"{html.escape(repr(labels[j - offset]) if j >= offset else f'cached {j}')} {row[j]:.2f}" for j in order
        ]
        who = html.escape(repr(labels[q])) if q < len(labels) else str(q)
        return message(f"layer {layer} head {head}: query {q} {who} attends most to " + ", ".join(parts))


def attention_explorer(run: Run, n_layers: int, labels: list[str] | None = None) -> AttentionExplorer:
    """Layer and head sliders → attention map (probabilities; a toggle shows the masked scores).
    `labels` name the positions (default: the run's token pieces)."""
    return AttentionExplorer(run, n_layers, labels)


# ----- kernel variants


def _option_label(name: str, doc: str | None, faulty: bool, width: int = 64) -> str:
    label = ("⚠ " if faulty else "") + name
    if doc and name != "default":
        text = f"{label}: {doc}"
        label = text if len(text) <= width else text[: width - 1] + "…"
    return label


def _top_k(run: Run, k: int) -> list[TopToken] | None:
    """run.top(k), or None when the run captured no logits."""
    return run.top(k) if "logits" in run else None


def _top_table(top: list[TopToken] | None, other: list[TopToken] | None, title: str) -> str:
    """The top tokens, those not among `other`'s in red."""
    if top is None:
        return message(f"{title}: no logits captured")
    other_ids = {t.id for t in other or ()}
    rows = "".join(
        f"<tr style='{'' if t.id in other_ids else 'color:#c00'}'><td style='white-space:pre;padding:0 6px'>"
        f"{html.escape(repr(t.piece))}</td><td style='text-align:right;padding:0 6px'>{t.prob:.3f}</td></tr>"
        for t in top
    )
    return f"<div><b>{html.escape(title)}</b><table>{rows}</table></div>"


class VariantSwitcher(Panel):
    """One dropdown per op family that has more than one variant; the re-run button (or, with
    auto=True, any change) calls `rerun({family: variant, ...})` (the notebook wires the lab in) and
    shows the top-k tokens against the reference's, the first divergence, the run's
    timings["recomputed_from"] and total_s, and figures.divergence. `docs[family][name]` goes into
    the option labels, `faulty[family]` names get a ⚠ mark. Given `lab=`, the dropdowns follow the
    lab's selection when another cell switches it (`lab.use`), and the shown result says it is stale.

    `selection` is always complete ({family: variant} for every dropdown, "default" included), so
    the callback can apply it as is. `select({...})` sets the dropdowns and runs, from code."""

    css_class = "labkit-variant-switcher"

    def __init__(
        self,
        families: Mapping[str, Iterable[str]],
        rerun: Rerun,
        reference: Run,
        docs: Mapping[str, Mapping[str, str]] | None = None,
        faulty: Mapping[str, Iterable[str]] | None = None,
        auto: bool = False,
        k: int = 5,
        lab=None,
    ):
        self.rerun, self.reference, self.k = rerun, reference, k
        self.reference_top = _top_k(reference, k)
        self.docs = {f: dict(d) for f, d in (docs or {}).items()}
        self.faulty = {f: set(n) for f, n in (faulty or {}).items()}
        self.last_run: Run | None = None
        self.last_comparison: Comparison | None = None
        self.history: list[dict] = []
        self._quiet = False
        self.dropdowns: dict[str, W.Dropdown] = {}
        for fam, names in families.items():
            names = list(names)
            if len(names) < 2:
                continue
            names = ["default"] + [n for n in names if n != "default"]
            options = [
                (_option_label(n, self.docs.get(fam, {}).get(n), n in self.faulty.get(fam, ())), n) for n in names
            ]
            dd = W.Dropdown(
                options=options,
                value="default",
                description=fam,
                style={"description_width": "110px"},
                layout=W.Layout(width="480px"),
            )
            dd.observe(self._changed, names="value")
            self.dropdowns[fam] = dd
        if not self.dropdowns:
            raise ValueError("no op family has more than one variant: nothing to switch")
        if lab is not None:  # follow switches made elsewhere (another cell's lab.use)
            lab.on_variants_changed(self.follow)
        self.button = W.Button(description="re-run", icon="play", button_style="primary")
        self.button.on_click(lambda _: self._run_safely())
        self.reset = W.Button(description="all defaults", icon="undo")
        self.reset.on_click(lambda _: self.select({}, run=self.auto.value))
        self.auto = W.Checkbox(value=auto, description="re-run on change", indent=False)
        self.status = W.HTML(message("pick variants, then re-run"))
        self.about = W.HTML()
        self.result = W.HTML()
        self.image = W.Image(format="png")
        self.runs_log = W.HTML()
        dds = list(self.dropdowns.values())
        grid = W.GridBox(dds, layout=W.Layout(grid_template_columns="repeat(2, 490px)"))
        super().__init__(
            [
                grid,
                W.HBox([self.button, self.reset, self.auto]),
                self.status,
                self.about,
                self.result,
                self.image,
                self.runs_log,
            ]
        )

    @property
    def selection(self) -> dict[str, str]:
        """{family: variant} of every dropdown."""
        return {fam: dd.value for fam, dd in self.dropdowns.items()}

    def select(self, selection: Mapping[str, str], run: bool = True) -> Run | None:
        """Set the dropdowns (families not named go back to "default") and, with run=True, re-run.
        Errors from the callback propagate here (a click shows them in the widget instead)."""
        unknown = [f for f in selection if f not in self.dropdowns]
        if unknown:
            raise KeyError(f"no dropdown for {unknown}; families: {', '.join(self.dropdowns)}")
        self._quiet = True
        try:
            for fam, dd in self.dropdowns.items():
                dd.value = selection.get(fam, "default")
        finally:
            self._quiet = False
        self.refresh()
        return self.run() if run else None

    def follow(self, selected: Mapping[str, str]) -> None:
        """The lab's selection changed outside the widget: show it in the dropdowns (families not
        in it back to default), and mark the result below as from another selection."""
        new = {f: selected.get(f, "default") for f in self.dropdowns}
        if new == self.selection:
            return
        self._quiet = True
        try:
            for fam, dd in self.dropdowns.items():
                if new[fam] in [v for _, v in dd.options]:
                    dd.value = new[fam]
        finally:
            self._quiet = False
        self.refresh()
        if self.last_run is not None:
            self.status.value = message(
                "the lab's variants changed since the result below (now "
                + html.escape(_fmt_selection(self.selection))
                + "): re-run to see them",
                "#b60",
            )

    def run(self) -> Run:
        """Call `rerun(self.selection)`, compare its Run with the reference and show the result."""
        sel = self.selection
        self.button.disabled, self.button.description = True, "running…"
        self.status.value = message("running " + _fmt_selection(sel) + " …")
        try:
            run = self.rerun(dict(sel))
        finally:
            self.button.disabled, self.button.description = False, "re-run"
        cmp = compare(run, self.reference)
        self.last_run, self.last_comparison = run, cmp
        self._show(sel, run, cmp)
        return run

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception as e:  # a click has no cell to show a traceback in: show it here
            self.status.value = message(
                f"re-run failed: {html.escape(type(e).__name__)}: {html.escape(str(e))}", "#c00"
            )

    def _changed(self, change) -> None:
        if self._quiet:
            return
        self.refresh()
        if self.auto.value:
            self._run_safely()

    def refresh(self, *_) -> None:
        """Describe the variants the dropdowns select (re-running is `run()`)."""
        chosen = [(f, n) for f, n in self.selection.items() if n != "default"]
        if not chosen:
            self.about.value = message("every family at its default (correct) variant")
            return
        items = "".join(
            f"<li><code>{html.escape(f)}={html.escape(n)}</code>"
            f"{' <b style=color:#c00>faulty</b>' if n in self.faulty.get(f, ()) else ''}: "
            f"{html.escape(self.docs.get(f, {}).get(n, ''))}</li>"
            for f, n in chosen
        )
        self.about.value = f"<ul style='{FONT};margin:2px 0'>{items}</ul>"

    def _show(self, sel: dict[str, str], run: Run, cmp: Comparison) -> None:
        t = run.timings
        rec = t.get("recomputed_from")
        total = t.get("total_s")
        first = cmp.first_divergence
        n_failed = sum(not r.passed for r in cmp.rows)
        parts = [f"ran {html.escape(_fmt_selection(sel))}"]
        if total is not None:
            parts.append(f"{total:.2f} s")
        if rec:
            parts.append(f"recomputed from <code>{html.escape(rec)}</code>")
        elif "recomputed_from" in t:
            parts.append("nothing recomputed")
        status = message(" · ".join(parts))
        if first is None:
            verdict = f"<b style='color:#2a7'>✓ every stage within its threshold against {self.reference.engine}</b>"
        else:
            r = cmp.row(first)
            why = r.reason if r.reason != "nmse" else f"nmse {r.nmse:.2e} > {r.threshold:.0e}"
            verdict = (
                f"<b style='color:#c00'>first divergence: <code>{html.escape(first)}</code></b> ({html.escape(why)}); "
                f"{n_failed} of {len(cmp.rows)} stages fail"
            )
        missing = f" · {len(cmp.missing)} stages not compared (not captured)" if cmp.missing else ""
        run_top = _top_k(run, self.k)
        tables = _top_table(run_top, self.reference_top, "this run") + _top_table(
            self.reference_top, run_top, self.reference.engine
        )
        result = (
            f"<div style='{FONT}'>{verdict}{missing}"
            f"<div style='display:flex;gap:30px;margin-top:4px'>{tables}</div></div>"
        )
        fig, ax = axes(9, 4.2)
        static.divergence(cmp, ax=ax)  # the first divergence is marked ✕ on the layer × kind grid
        image = png(fig)
        # everything is computed before any of it is shown: the figure never lags behind the text
        self.image.value, self.result.value, self.status.value = image, result, status
        top1 = run_top[0].piece if run_top else None
        self.history.append(
            {"selection": {f: n for f, n in sel.items() if n != "default"}, "first_divergence": first, "top1": top1}
            | {"recomputed_from": rec, "total_s": total}
        )
        rows = "".join(_history_row(h) for h in self.history[-6:][::-1])
        self.runs_log.value = (
            f"<details style='{FONT}'><summary>runs so far ({len(self.history)})</summary><table>"
            "<tr><th>variants</th><th>first divergence</th><th>top-1</th><th>recomputed from</th><th>time</th></tr>"
            f"{rows}</table></details>"
        )


def _history_row(h: dict) -> str:
    cells = [
        html.escape(_fmt_selection(h["selection"])),
        f"<code>{html.escape(str(h['first_divergence']))}</code>",
        html.escape(repr(h["top1"])),
        html.escape(str(h["recomputed_from"])),
        "" if h["total_s"] is None else f"{h['total_s']:.2f} s",
    ]
    return "<tr>" + "".join(f"<td style='white-space:pre;padding:0 6px'>{c}</td>" for c in cells) + "</tr>"


def _fmt_selection(sel: Mapping[str, str]) -> str:
    chosen = [f"{f}={n}" for f, n in sel.items() if n != "default"]
    return ", ".join(chosen) if chosen else "all defaults"


variant_switcher = VariantSwitcher


# ----- the pass, stage by stage
