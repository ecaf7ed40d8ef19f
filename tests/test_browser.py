"""JupyterLab in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright):
the walkthrough opens, its cells run from the keyboard, and the widget and figures render."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    port = free_port()
    home = tmp_path_factory.mktemp("jupyter-home")
    settings = home / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
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
            f"--ServerApp.root_dir={ROOT}",
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
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle'], .jp-Toolbar-kernelStatus", timeout=120_000
        )
        page.click(".jp-CodeCell .jp-InputArea-editor")  # the first code cell (markdown editors are hidden)
        n_cells = page.locator(".jp-Notebook .jp-Cell").count()
        for _ in range(n_cells):
            page.keyboard.press("Shift+Enter")
            time.sleep(0.2)
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
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()
        assert not [e for e in errors if "Error" in e and "XDG_RUNTIME_DIR" not in e], errors
        page.screenshot(path=str(ROOT / "tests" / "artifacts" / "walkthrough.png"), full_page=False)
        browser.close()
