"""JupyterLab in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright):
each lesson opens, its exercise checks pass, the widgets and figures render, a moved widget changes
its explanation and its figure, and hovering a plotly figure shows a tooltip naming what is under
the mouse (both tokens of an attention map). The variant switcher re-runs the model through its
callback. Screenshots go to tests/artifacts/.

The lessons with widgets (LIVE) run in the browser (Run → Run All Cells) from a copy with its
outputs cleared: saved outputs must not satisfy a wait, and a widget's callback needs the kernel
that drew it; JupyterLab then saves that run for test_lessons to check. The others draw plotly
figures only: JupyterLab serves them as this session's kernel ran them for test_lessons
(notebook_outputs.executed). So each lesson runs once in the suite.
Running cells in the browser (and its autosave) never rewrites the repository's notebook."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest
from notebook_outputs import LESSONS, executed, ran_elsewhere, with_worked_answers

from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
KERNEL_IDLE = "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')].some(e => / \\| Idle/.test(e.innerText))"
LIVE = ("01_walkthrough", "02_attention", "03_logit_lens", "04_kernel_variants")  # widgets call the kernel
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def shows(page, selector: str, text: str, timeout: int = 60_000) -> None:
    """Wait until the first element matching `selector` shows `text`; fail with what it shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "([sel, t]) => (document.querySelector(sel)?.innerText || '').includes(t)",
            arg=[selector, text],
            timeout=timeout,
        )
    except PlaywrightTimeout:
        shown = page.evaluate(  # the HTML parts of a widget (its dropdowns would list every option)
            "(sel) => { const e = document.querySelector(sel); if (!e) return null; "
            "const h = [...e.querySelectorAll('.widget-html')].map(x => x.innerText); "
            "return h.length ? h.join('\\n') : e.innerText; }",
            selector,
        )
        raise AssertionError(f"{selector} never showed {text!r}; it shows:\n{shown}") from None


class Served(NamedTuple):
    """A running JupyterLab: its address and the folder it serves (its notebooks/ holds the lessons)."""

    url: str
    root: Path


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    port = free_port()
    home = tmp_path_factory.mktemp("jupyter-home")
    served = tmp_path_factory.mktemp("served")
    (served / "notebooks").mkdir()
    for name in LESSONS:
        if name in LIVE:
            nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
            with_worked_answers(nb)  # a student who has done the exercises: every check must pass
            for cell in nb.cells:  # saved outputs would satisfy every wait below before a cell has run
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
        else:
            nb = copy.deepcopy(executed(name)[1])  # as this session's kernel ran it, worked answers in
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, served / "notebooks" / f"{name}.ipynb")
    # and one as committed, with its outputs and widget state, for what a reader sees before running
    shutil.copy(ROOT / "notebooks" / "04_kernel_variants.ipynb", served / "notebooks" / "saved.ipynb")
    settings = home / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    # JupyterLab 4 virtualizes long notebooks (cells off screen leave the DOM): keep every cell
    # rendered, so the widget and figure selectors find outputs above the viewport
    tracker = home / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    # no autosave: a live lesson runs past its 2-minute interval under the suite's load, and an
    # autosave in flight when keep_run saves made JupyterLab ask "File Changed" (a modal dialog
    # over the plots, so no hover reached them); keep_run's save is the only one
    docmanager = home / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True)
    (docmanager / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab" / "user-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab" / "workspaces"),  # no tabs restored from other runs
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={served}",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(url + "/api", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("jupyter lab did not start")
    yield Served(url, served)
    proc.terminate()
    proc.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_walkthrough_in_jupyterlab(jupyter, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        run_all(page, jupyter, "01_walkthrough")
        page.wait_for_selector(".widget-slider", timeout=60_000)
        page.wait_for_selector(".jp-OutputArea-output img", timeout=60_000)
        assert "' blue'" in page.locator(".jp-Notebook").inner_text()
        checks_pass(page, "01_walkthrough")
        artifacts = ARTIFACTS
        shot = artifacts / "walkthrough.png"
        page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 10_000

        # the rich Run display and the explorers rendered
        assert page.locator(".labkit-run").count() >= 1
        assert page.locator(".labkit-array img").count() >= 1
        for cls in ("labkit-stage-explorer", "labkit-attention-explorer", "labkit-variant-switcher"):
            page.wait_for_selector(f".{cls}", timeout=60_000)
        assert page.locator(".labkit-variant-switcher .widget-dropdown select").count() >= 4
        assert page.locator(".labkit-attention-explorer img").count() == 1

        # the attention explorer redraws on a click: probabilities → masked scores
        attn = page.locator(".labkit-attention-explorer")
        before = attn.locator("img").get_attribute("src")
        attn.locator("button", has_text="scores").click()
        page.wait_for_function(
            "(src) => document.querySelector('.labkit-attention-explorer img').getAttribute('src') !== src",
            arg=before,
            timeout=60_000,
        )

        # moving a widget changes its explanation and its figure: the stage explorer's stage dropdown
        moved = move_stage_explorer(page, "logits")
        assert "unembedding" in moved, moved
        # hovering the plotly attention map names the query token, the key token and the probability
        tip = hover_plotly(page, "01_walkthrough", "attn")
        assert "query" in tip and "key" in tip and "probability" in tip and "'" in tip, tip
        page.screenshot(path=str(artifacts / "walkthrough-hover.png"), full_page=False)

        # the variant switcher: the notebook's own run (rope=normal_pairs) shows, then a click re-runs
        sw = page.locator(".labkit-variant-switcher")
        sw.scroll_into_view_if_needed()
        shows(page, ".labkit-variant-switcher", "first divergence: blk.0.q_rope")
        sw.locator("button", has_text="all defaults").click()  # dropdowns only: auto re-run is off
        lm_head = sw.locator(".widget-dropdown", has=page.locator("label", has_text="lm_head")).locator("select")
        label = lm_head.locator("option", has_text="skip_last_window").text_content()
        lm_head.select_option(label=label)
        sw.locator("button", has_text="re-run").click()
        shows(page, ".labkit-variant-switcher", "first divergence: logits", timeout=120_000)
        shot2 = artifacts / "walkthrough-variants.png"
        page.screenshot(path=str(shot2), full_page=False)
        assert shot2.stat().st_size > 10_000
        sw.locator("button", has_text="all defaults").click()
        sw.locator("button", has_text="re-run").click()
        shows(page, ".labkit-variant-switcher", "every stage within its threshold", timeout=120_000)
        # the live lab re-ran only the stage the switch affects
        shows(page, ".labkit-variant-switcher", "ran all defaults · ")
        shows(page, ".labkit-variant-switcher", "recomputed from logits")
        browser.close()


def run_all(page, jupyter: Served, name: str) -> None:
    """Open a served notebook, wait for its kernel, Run All Cells, and wait for the last code cell's
    output (failing fast, with the traceback, on a cell error; a worked answer, markdown, may end it);
    then keep the run for the lesson tests (keep_run), before any widget moves."""
    page.goto(f"{jupyter.url}/lab/tree/notebooks/{name}.ipynb?reset")  # this notebook alone, no restored tabs
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    n_cells = len(nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells)
    try:
        page.wait_for_function(
            "(n) => document.querySelectorAll('.jp-Notebook .jp-Cell').length === n", arg=n_cells, timeout=120_000
        )
    except Exception:
        shown = page.evaluate("() => document.querySelectorAll('.jp-Notebook .jp-Cell').length")
        page.screenshot(path=str(ARTIFACTS / f"{name}-cells.png"))
        raise AssertionError(f"{name}: {shown} cells rendered, {n_cells} in the notebook") from None
    # the kernel is connected and idle (a cell run before that is dropped)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
    page.wait_for_function(
        "() => { const o = [...document.querySelectorAll('.jp-OutputArea-output')]; "
        "if (o.some(e => e.innerText.includes('Traceback'))) return true; "
        "const c = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]; const last = c[c.length - 1]; "
        "return last && last.querySelector('.jp-OutputArea-output'); }",
        timeout=600_000,
    )
    tracebacks = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts() if "Traceback" in t]
    assert not tracebacks, tracebacks[0][-800:]
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    assert not [e for e in stderr if "Error" in e and "XDG_RUNTIME_DIR" not in e], stderr
    keep_run(page, jupyter, name)


def keep_run(page, jupyter: Served, name: str) -> None:
    """Save the notebook as the browser's kernel ran it, before any widget moves, and hand it to the
    lesson tests (notebook_outputs.ran_elsewhere): a live lesson runs once in the suite."""
    path = jupyter.root / "notebooks" / f"{name}.ipynb"
    page.wait_for_function(  # every cell has run: no [*] prompt, and the kernel is idle
        "() => ![...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')].some(p => p.innerText.includes('*'))",
        timeout=600_000,
    )
    page.wait_for_function(KERNEL_IDLE, timeout=600_000)
    before = path.stat().st_mtime_ns
    page.click(".lm-MenuBar-itemLabel:text-is('File')")
    page.click(".lm-Menu-itemLabel:text-is('Save Notebook')")
    for _ in range(120):
        if path.stat().st_mtime_ns != before:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"{name}: JupyterLab never saved the notebook")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=60_000)  # the save returned
    if page.locator(".jp-Dialog").count():  # the save asked something: a modal would block every hover
        page.screenshot(path=str(ARTIFACTS / f"{name}-dialog.png"))
        raise AssertionError(f"{name}: saving opened a dialog: {page.locator('.jp-Dialog').inner_text()[:200]}")
    for _ in range(20):  # the server writes the file in place: a read may meet it half written
        try:
            saved = nbformat.read(path, as_version=4)
            break
        except ValueError:  # json's decode error
            time.sleep(0.5)
    else:
        raise AssertionError(f"{name}: the saved notebook never read whole")
    ran_elsewhere(name, saved)


def open_ran(page, jupyter: Served, name: str) -> None:
    """Open a served notebook that the kernel has already run; wait until its last code cell's
    outputs have rendered."""
    page.goto(f"{jupyter.url}/lab/tree/notebooks/{name}.ipynb?reset")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    page.wait_for_function(
        "() => { const c = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]; "
        "const last = c[c.length - 1]; return last && last.querySelector('.jp-OutputArea-output'); }",
        timeout=120_000,
    )
    tracebacks = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts() if "Traceback" in t]
    assert not tracebacks, tracebacks[0][-800:]


def checks_pass(page, name: str) -> None:
    """Every exercise check cell shows ✓, none ✗."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    n = sum(1 for c in nb.cells if c.id.endswith("-check"))
    page.wait_for_function("(n) => document.querySelectorAll('.labkit-check').length === n", arg=n, timeout=60_000)
    shown = page.locator(".labkit-check").all_inner_texts()
    assert len(shown) >= 2 and all(t.startswith("✓") for t in shown), shown


def cell(page, name: str, cell_id: str):
    """The rendered cell of a notebook cell id (cells render in order, windowing is off)."""
    source = {"saved": "04_kernel_variants"}.get(name, name)  # the committed copy is served as saved.ipynb
    nb = nbformat.read(ROOT / "notebooks" / f"{source}.ipynb", as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if c.id == cell_id)
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def hover_plotly(page, name: str, cell_id: str) -> str:
    """Move the mouse over the middle of a cell's plotly plot area; return the tooltip's text."""
    out = cell(page, name, cell_id).locator(".jp-RenderedPlotly").first
    out.wait_for(timeout=60_000)
    out.scroll_into_view_if_needed()
    plot = out  # plotly draws into the renderer's own node (it becomes the .js-plotly-plot)
    for _ in range(30):  # plotly's renderer shows the still PNG until the mouse enters it
        if out.evaluate("e => e.classList.contains('js-plotly-plot') && !!e.querySelector('.nsewdrag')"):
            break
        still = out.locator("img.plot-img")
        if still.count():
            still.dispatch_event("mouseenter")
            box = still.bounding_box()
            if box:
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=3)
        time.sleep(1)
    else:
        page.screenshot(path=str(ARTIFACTS / f"{name}-{cell_id}-no-plot.png"))
        raise AssertionError(f"{name}/{cell_id}: the still never became a plot: {out.inner_html()[:300]}")
    plot.scroll_into_view_if_needed()
    area = plot.locator(".nsewdrag").first
    area.wait_for(state="visible", timeout=30_000)
    box = area.bounding_box()
    for fx, fy in ((0.3, 0.7), (0.5, 0.5), (0.2, 0.9), (0.7, 0.8)):
        page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
        try:
            page.wait_for_function(
                "(el) => el.querySelector('.hoverlayer .hovertext')", arg=plot.element_handle(), timeout=5_000
            )
        except Exception:  # a masked (blank) cell has no tooltip: try another point
            continue
        return plot.locator(".hoverlayer .hovertext").first.text_content()
    raise AssertionError(f"{name}/{cell_id}: no plotly tooltip appeared")


def move_stage_explorer(page, stage: str) -> str:
    """Pick a stage in the (first) stage explorer's dropdown; wait until its explanation and its
    histogram both change; return the new explanation's text."""
    ex = page.locator(".labkit-stage-explorer").first
    ex.scroll_into_view_if_needed()
    before_text = ex.locator(".labkit-explain").inner_text()
    before_img = ex.locator("img").first.get_attribute("src")
    ex.locator(".widget-dropdown select").first.select_option(label=stage)
    page.wait_for_function(
        "([t, src]) => { const e = document.querySelector('.labkit-stage-explorer'); "
        "const x = e.querySelector('.labkit-explain'); const i = e.querySelector('img'); "
        "return x && x.innerText !== t && i && i.getAttribute('src') !== src; }",
        arg=[before_text, before_img],
        timeout=60_000,
    )
    return ex.locator(".labkit-explain").inner_text()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
@pytest.mark.parametrize("name", LESSONS[1:])
def test_lesson_in_jupyterlab(jupyter, name):
    """Lessons 02–04 and 06–12: run (or as run), checks pass, a widget moves its explanation and
    figure, plotly hovers; lesson 11's kernel bench is kept as a screenshot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        (run_all if name in LIVE else open_ran)(page, jupyter, name)
        checks_pass(page, name)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)
        if name == "02_attention":
            attn = page.locator(".labkit-attention-explorer")
            attn.scroll_into_view_if_needed()
            text, src = attn.locator(".labkit-explain").inner_text(), attn.locator("img").get_attribute("src")
            attn.locator("button", has_text="scores").click()
            page.wait_for_function(
                "([t, s]) => { const e = document.querySelector('.labkit-attention-explorer'); "
                "return e.querySelector('.labkit-explain').innerText !== t && e.querySelector('img').src !== s; }",
                arg=[text, src],
                timeout=60_000,
            )
            assert "attn_scores" in attn.locator(".labkit-explain").inner_text()
            tip = hover_plotly(page, name, "one-head")
            assert "query" in tip and "key" in tip and "probability" in tip, tip
        elif name == "07_sampling":  # no widget and no map: the checks above are its test here
            pass
        elif name == "08_quantization":  # no widget: the faulty reader's divergence map hovers
            tip = hover_plotly(page, name, "heat-mins")
            assert "NMSE" in tip and "threshold" in tip, tip
        elif name == "09_mixture_of_experts":  # no widget: the router map hovers a token's expert
            tip = hover_plotly(page, name, "router")
            assert "token" in tip and "expert" in tip and "probability" in tip, tip
        elif name == "11_write_a_kernel":  # the student's kernels, timed: the bench figure hovers, and is kept
            tip = hover_plotly(page, name, "ex5-try")
            assert "kernel" in tip and "ms" in tip, tip
            cell(page, name, "ex5-try").screenshot(path=str(ARTIFACTS / f"{name}-bench.png"))
        elif name == "13_latent_attention":  # no widget: the absorbed attention's map hovers a query and key
            tip = hover_plotly(page, name, "attn-map")
            assert "query" in tip and "key" in tip and "probability" in tip, tip
        elif name == "12_serving_paths":  # no widget: the paths map hovers a path's stage
            tip = hover_plotly(page, name, "paths-map")
            assert "path" in tip and "stage" in tip and "NMSE" in tip, tip
        elif name == "10_recurrent_state":  # no widget: the state fault's divergence map hovers
            tip = hover_plotly(page, name, "fault-figure")
            assert "NMSE" in tip and "threshold" in tip, tip
        elif name == "06_prefill_decode":  # no widget: the decode step's attention map hovers
            tip = hover_plotly(page, name, "sky")
            assert "query" in tip and "key" in tip and "probability" in tip, tip
        else:
            moved = move_stage_explorer(page, "attn_probs")
            assert "attention pattern" in moved, moved
            cell_id, words = (
                ("lens", ("input", "top")) if name == "03_logit_lens" else ("heat-norm", ("NMSE", "threshold"))
            )
            tip = hover_plotly(page, name, cell_id)
            assert all(w in tip for w in words), tip
        page.screenshot(path=str(ARTIFACTS / f"{name}-hover.png"), full_page=False)
        browser.close()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_committed_notebook_shows_its_figures_and_widgets_before_running(jupyter):
    """Opened as committed, without running a cell: the plotly figures draw, the widgets render from
    their saved state (or as their still), and no widget shows as `HBox(…` text."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{jupyter.url}/lab/tree/notebooks/saved.ipynb?reset")
        page.wait_for_selector(".jp-Notebook .jp-OutputArea-output", timeout=120_000)
        page.wait_for_selector(".jp-RenderedPlotly img.plot-img", timeout=120_000)  # the stills
        tip = hover_plotly(page, "saved", "heat-norm")  # the mouse turns a still into the live figure
        assert "NMSE" in tip and "threshold" in tip, tip
        page.wait_for_selector(".labkit-stage-explorer, .labkit-stage-explorer-still", timeout=120_000)
        text = page.locator(".jp-Notebook").inner_text()
        assert "children=(" not in text and "HBox(" not in text
        nb = nbformat.read(ROOT / "notebooks" / "04_kernel_variants.ipynb", as_version=4)
        shipped = sum(1 for c in nb.cells if c.id.endswith("-check"))  # each saying nothing is written yet
        assert page.locator(".labkit-check").count() == shipped >= 2
        page.screenshot(path=str(ARTIFACTS / "saved-notebook.png"), full_page=False)
        browser.close()
