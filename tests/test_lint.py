"""The code style is part of the build: ruff lint and format checks over the repository."""

from __future__ import annotations

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
