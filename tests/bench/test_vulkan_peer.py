"""llama.cpp's Vulkan backend as a bench peer (labkit.bench.vulkan_peer): without `make peer-vulkan`
the bench says so and goes on; its figures become ratios against labkit's GPU engine."""

from __future__ import annotations

import importlib.util

from labkit.bench.report import BenchReport, EngineFigures, LengthFigures
from labkit.bench.vulkan_peer import run_peer


def test_a_missing_peer_is_said_not_raised(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cyllama" else real(name, *a))
    got = run_peer(tmp_path / "model.gguf", [8], 1, 4)
    assert got == {"error": "llama.cpp's Vulkan peer is not installed (make peer-vulkan: cyllama-vulkan 0.2.18)"}


def test_the_peer_figures_become_ratios_against_the_gpu_engine():
    gpu = EngineFigures("gpu", 1.0, [LengthFigures(8, logits_all_s=0.2, last_only_s=0.1)], decode_tok_s=10.0)
    cpu = EngineFigures("llamacpp", 0.5, [LengthFigures(8, logits_all_s=0.05)], decode_tok_s=40.0)
    detail = "llvmpipe (LLVM 15.0.6, 256 bits), ggml 0.12.0 (b64739e), from cyllama-vulkan 0.2.18"
    vk = EngineFigures("llamacpp-vulkan", 0.3, [LengthFigures(8, last_only_s=0.4)], decode_tok_s=2.0, detail=detail)
    report = BenchReport("m", "llvmpipe", 2, {"gpu": gpu, "llamacpp": cpu, "llamacpp-vulkan": vk})
    r = report.ratios()
    assert r["gpu/llamacpp decode rate"] == 0.25 and r["gpu/llamacpp-vulkan decode rate"] == 5.0
    assert (
        r["gpu/llamacpp prefill T=8 (logits all)"] == 4.0 and r["gpu/llamacpp-vulkan prefill T=8 (last only)"] == 0.25
    )
    text = report.table()
    assert "llamacpp-vulkan: llvmpipe" in text and "b64739e" in text
    assert BenchReport.from_dict(report.to_dict()).engines["llamacpp-vulkan"].detail == vk.detail
