"""The `labkit` command: JSON shapes, the engines, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import golden


def labkit(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labkit: error:"), p.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in p.stderr


def test_models_json():
    p = labkit("models", "--json")
    names = [m["name"] for m in json.loads(p.stdout)]
    assert names == ["gemma3-270m", "smollm2-135m"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_run_reference_json(model):
    p = labkit(
        "run", model, "--engine", "reference", "--prompt", "The color of the sky is", "--json", "--max-new-tokens", "2"
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    entry = golden(model)["prompts"][0]
    assert data["tokens"] == entry["tokens"]
    assert set(data) >= {"model", "tokens", "top", "generated", "timings", "variants"}
    assert data["top"][0]["piece"] == " a" and set(data["top"][0]) == {"id", "piece", "logit", "prob"}
    if model == "gemma3-270m":
        assert [t["piece"] for t in data["top"][:3]] == [" a", " the", " blue"]
    assert data["generated"]["ids"] == entry["greedy"][:2]


@pytest.mark.slow
def test_run_gpu_is_the_default_engine():
    p = labkit("run", "smollm2-135m", "--prompt", "The color of the sky is", "--json", "--top", "3")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["engine"] == "gpu" and len(data["top"]) == 3 and data["top"][0]["id"] == 253


def test_info_names_the_adapter():
    p = labkit("info", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["backend"] and d["limits"]["max-storage-buffer-binding-size"] > 0


def test_errors_are_one_line(tmp_path, tiny_model):
    assert_one_line_error(labkit("run", str(tmp_path / "missing.gguf"), "--prompt", "x"), "no such file")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    assert_one_line_error(labkit("run", str(bad), "--prompt", "x"), "not a GGUF file")
    cut = tmp_path / "cut.gguf"
    src = tiny_model("llama", "Q8_0").read_bytes()
    cut.write_bytes(src[: len(src) // 2])
    assert_one_line_error(labkit("run", str(cut), "--prompt", "x"), "truncated")
    assert_one_line_error(labkit("run", "no-such-model", "--prompt", "x"), "unknown model")
    long_prompt = "word " * 9000  # > 8192 tokens, < the 128 KiB argv limit
    assert_one_line_error(labkit("run", "smollm2-135m", "--prompt", long_prompt), "exceeds the context")
    assert_one_line_error(labkit("run", "smollm2-135m", "--prompt", "x", "--variant", "nonsense"), "op=name")
