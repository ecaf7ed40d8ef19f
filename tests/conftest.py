"""Shared fixtures: the real models (opened once per session), tiny synthetic models, golden files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import labkit
from labkit.model.tiny import TinySpec, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "data" / "golden"
REAL_MODELS = ("gemma3-270m", "smollm2-135m")


def golden(model: str) -> dict:
    return json.loads((GOLDEN / f"{model}.json").read_text())


@pytest.fixture(scope="session")
def gemma():
    return labkit.open("gemma3-270m")


@pytest.fixture(scope="session")
def smollm():
    return labkit.open("smollm2-135m")


@pytest.fixture(scope="session")
def real_lab(request):
    """Parametrize indirectly with a model name; labs are cached for the session."""
    return _open_cached(request.param)


_LABS: dict[str, labkit.Lab] = {}


def _open_cached(name: str) -> labkit.Lab:
    if name not in _LABS:
        _LABS[name] = labkit.open(name)
    return _LABS[name]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    """Factory: tiny_model(arch, weight_type, **spec) -> path (written once per spec)."""
    made: dict[TinySpec, Path] = {}

    def make(arch: str = "llama", weight_type: str = "Q8_0", **kw) -> Path:
        spec = TinySpec(arch=arch, weight_type=weight_type, **kw)
        if spec not in made:
            name = f"tiny-{arch}-{weight_type.lower()}-{abs(hash(spec)) % 10**8}.gguf"
            made[spec] = write_tiny_model(tiny_dir / name, spec)
        return made[spec]

    return make
