"""One notebook per case (notebooks/case_<name>.ipynb): written by scripts/make_case_notebooks.py,
and (slow) run top to bottom in a real Jupyter kernel with no cell errors, ending in a passed case."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.cases import cases

ROOT = Path(__file__).resolve().parents[1]
NAMES = [c.name for c in cases()]


def _script():
    spec = importlib.util.spec_from_file_location("make_case_notebooks", ROOT / "scripts" / "make_case_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def python3_kernel() -> str:
    """The `python3` kernelspec, installed for this interpreter (--user) if it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user"], check=True, capture_output=True)
    return "python3"


def test_every_case_has_a_notebook_matching_the_script():
    script = _script()
    assert set(script.BUILDERS) == set(NAMES)
    for name in NAMES:
        path = ROOT / "notebooks" / f"case_{name}.ipynb"
        assert path.exists(), f"run scripts/make_case_notebooks.py ({path.name} is missing)"
        on_disk = [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]
        built = [(c.cell_type, c.source) for c in script.BUILDERS[name]()]
        assert on_disk == built, f"{path.name} is stale: run scripts/make_case_notebooks.py"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_case_notebook_runs_in_a_real_kernel(name, python3_kernel):
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / f"case_{name}.ipynb", as_version=4)
    # run from notebooks/, as JupyterLab would: the first cell finds labkit one level up
    NotebookClient(
        nb, timeout=900, kernel_name=python3_kernel, resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the figures should render inline"
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"case {name} " in text and "\nPASSED" in text, "the notebook should end with the passed case report"
