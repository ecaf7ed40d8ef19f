"""JupyterLab in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright):
the walkthrough opens, its cells run (Run → Run All Cells), the widgets and figures render, and the
widgets answer clicks (the variant switcher re-runs the model through its callback).

JupyterLab serves a copy of the notebook with its outputs cleared: saved outputs must not satisfy a
wait, and running cells in the browser (and its autosave) must not rewrite the repository's notebook."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
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


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    port = free_port()
    home = tmp_path_factory.mktemp("jupyter-home")
    served = tmp_path_factory.mktemp("served")
    (served / "notebooks").mkdir()
    nb = nbformat.read(ROOT / "notebooks" / "01_walkthrough.ipynb", as_version=4)
    for cell in nb.cells:  # saved outputs would satisfy every wait below before a cell has run
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, served / "notebooks" / "01_walkthrough.ipynb")
    settings = home / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    # JupyterLab 4 virtualizes long notebooks (cells off screen leave the DOM): keep every cell
    # rendered, so the widget and figure selectors find outputs above the viewport
    tracker = home / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab" / "user-settings"),
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
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_walkthrough_in_jupyterlab(jupyter, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{jupyter}/lab/tree/notebooks/01_walkthrough.ipynb")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        n_cells = len(nbformat.read(ROOT / "notebooks" / "01_walkthrough.ipynb", as_version=4).cells)
        page.wait_for_function(
            "(n) => document.querySelectorAll('.jp-Notebook .jp-Cell').length === n", arg=n_cells, timeout=120_000
        )
        # the kernel is connected and idle (the toolbar's execution indicator says idle before that,
        # and a cell run then is dropped)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')].some(e => / \\| Idle/.test(e.innerText))",
            timeout=120_000,
        )
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        # fail fast on a cell error instead of waiting out the timeout
        page.wait_for_function(
            "() => document.querySelector('.widget-slider') || "
            "[...document.querySelectorAll('.jp-OutputArea-output')].some(e => e.innerText.includes('Traceback'))",
            timeout=600_000,
        )
        tracebacks = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts() if "Traceback" in t]
        assert not tracebacks, tracebacks[0][-600:]
        page.wait_for_selector(".widget-slider", timeout=600_000)
        page.wait_for_selector(".jp-OutputArea-output img", timeout=600_000)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
            ".some(e => e.innerText.includes(\"' blue'\"))",
            timeout=600_000,
        )
        # the notebook finishes: the last cell (generation) prints its text
        page.wait_for_function(
            "() => { const c = [...document.querySelectorAll('.jp-Notebook .jp-Cell')]; "
            "const last = c[c.length - 1]; return last && last.querySelector('.jp-OutputArea-output'); }",
            timeout=600_000,
        )
        tracebacks = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts() if "Traceback" in t]
        assert not tracebacks, tracebacks[0][-600:]
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()
        assert not [e for e in errors if "Error" in e and "XDG_RUNTIME_DIR" not in e], errors
        artifacts = ROOT / "tests" / "artifacts"
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
