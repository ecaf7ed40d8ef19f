"""The code style is part of the build: ruff lint and format checks over the repository."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check():
    p = ruff("check", ".")
    assert p.returncode == 0, p.stdout[-3000:]


def test_ruff_format():
    p = ruff("format", "--check", ".")
    assert p.returncode == 0, p.stdout[-3000:]


def test_no_function_longer_than_a_screen_in_the_engine():
    """labkit/gpu, labkit/model, labkit/ops and labkit/dumps: no function over 60 lines (the op-modules rule)."""
    long = []
    for pkg in ("gpu", "model", "ops", "dumps"):
        for path in sorted((ROOT / "labkit" / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > 60:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_engines_do_not_branch_on_ops():
    """Both engines are loops over the graph that call labkit.ops: no if/elif on op names."""
    for rel in ("labkit/model/reference.py", "labkit/gpu/executor.py"):
        text = (ROOT / rel).read_text()
        hits = [ln for ln in text.splitlines() if re.search(r"\bop\s*[!=]=|\.op\s+in\b", ln)]
        assert not hits, f"{rel} branches on an op: {hits}"
