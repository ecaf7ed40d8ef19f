"""One notebook per case (notebooks/case_<name>.ipynb), the notebook itself its only source: valid,
and (slow) run top to bottom in a real Jupyter kernel with no cell errors, ending in a passed case.
What its own `run_case` reported is kept for test_cases, so each case runs once in the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_outputs import CASE_REPORTS, assert_outputs_match, assert_shippable, execute

from labkit.casebook import cases

ROOT = Path(__file__).resolve().parents[2]
NAMES = [c.name for c in cases()]
REPORT = "import json\nprint(json.dumps({'report': report.to_dict(), 'text': report.text()}))"


@pytest.fixture(scope="session")
def python3_kernel() -> str:
    """The `python3` kernelspec, installed for this interpreter (--user) if it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user"], check=True, capture_output=True)
    return "python3"


def test_every_case_has_a_valid_notebook_of_its_own():
    on_disk = {p.name[len("case_") : -len(".ipynb")] for p in (ROOT / "notebooks").glob("case_*.ipynb")}
    assert on_disk == set(NAMES), f"notebooks without a case or cases without a notebook: {on_disk ^ set(NAMES)}"
    for name in NAMES:
        nb = nbformat.read(ROOT / "notebooks" / f"case_{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert name in code, f"case_{name}.ipynb does not run its case"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_case_notebook_runs_in_a_real_kernel(name, python3_kernel):
    # run from notebooks/, as JupyterLab would: the first cell finds labkit one level up
    committed, nb, _ = execute(f"case_{name}", cwd=ROOT / "notebooks", after=REPORT)
    printed = [o.text for o in nb.cells.pop().outputs if o.output_type == "stream" and o.name == "stdout"]
    CASE_REPORTS[name] = json.loads("".join(printed))  # what the `after` cell printed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the figures should render inline"
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"case {name} " in text and "\nPASSED" in text, "the notebook should end with the passed case report"
    # shipped with its outputs (GitHub and a fresh JupyterLab show them), still matching its code
    assert_outputs_match(committed, nb)
    assert_shippable(f"case_{name}")
