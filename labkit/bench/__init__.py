"""Benchmarks: prefill at several prompt lengths, decode, and a re-run after a switch, for the GPU
path, the float64 numpy reference and llama.cpp, measured in one process.

Every figure is the median of `repeats` runs after a warm-up, and is reported as a ratio against
the reference measured in the same run (speed on this machine depends on what else runs; ratios
taken together are what compare). Per op family, GPU time over a prefill comes from timestamp
queries; over one decode step, from each family's dispatches submitted alone and waited for
(lavapipe's timestamps misplace small dispatches); with the matmuls' GFLOP/s and GB/s (GGUF bytes
read). `labkit bench` prints the table; `--json` the data.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit import progress as bars
from labkit.bench.engines import (
    bench_batch,
    bench_gpu,
    bench_llamacpp,
    bench_llamacpp_vulkan,
    bench_reference,
    op_family_times,
)
from labkit.bench.measure import GOLDEN_DIR, TEXT, cpu_model, n_steps, peak_rss_mb, progress, prompt_of
from labkit.bench.report import BatchFigures, BenchReport, EngineFigures, LengthFigures, OpFamilyTime
from labkit.gpu.device import get_device
from labkit.lab import open as open_lab

__all__ = ["GOLDEN_DIR", "TEXT", "BatchFigures", "BenchReport", "EngineFigures", "LengthFigures", "OpFamilyTime",
           "cpu_model", "n_steps", "peak_rss_mb", "prompt_of", "run_bench", "save"]  # fmt: skip


def run_bench(
    model: str = "gemma3-270m",
    lengths: tuple[int, ...] = (8, 128),
    repeats: int = 3,
    decode_tokens: int = 32,
    quiet: bool = False,
    engines: tuple[str, ...] = ("gpu", "reference", "llamacpp"),
    memory: str | None = None,
    variants: dict[str, str] | None = None,
    batch: int | None = None,
) -> BenchReport:
    """GPU first (its peak RSS is then the GPU path's alone), then the reference, then llama.cpp.
    `model` is a registered name or a .gguf path; `memory` the labs' budget (labkit.open);
    `variants` the GPU engine's kernel selection ({family: variant}, as lab.use); `batch`: a decode
    step of that many sequences against one sequence's (labkit.batch)."""
    say = progress(quiet, n_steps(engines, lengths, bool(batch)))
    out: dict[str, EngineFigures] = {}
    lab = open_lab(model, memory=memory, variants=variants)
    try:
        with bars.quiet():  # one bar: the measured generates and passes show none of their own
            if "gpu" in engines:
                out["gpu"] = bench_gpu(lab, lengths, repeats, decode_tokens, say)
                ops_at = max((n for n in lengths if n <= 512), default=min(lengths))
                say(f"gpu time per op family, T={ops_at}")
                ops = op_family_times(lab, prompt_of(lab, ops_at))
                say(f"gpu time per op family, a decode step after {ops_at} tokens")
                dec_ops = op_family_times(lab, prompt_of(lab, ops_at), decode=True)
                batch_figures = bench_batch(lab, batch, repeats, decode_tokens, say) if batch else None
            else:
                ops, dec_ops, ops_at, batch_figures = [], [], 0, None
            if "reference" in engines:
                out["reference"] = bench_reference(model, lengths, repeats, decode_tokens, say, memory)
            if "llamacpp" in engines:
                lc = bench_llamacpp(lab, lengths, repeats, decode_tokens, say)
                if lc is not None:
                    out["llamacpp"] = lc
            if "llamacpp-vulkan" in engines:
                vk = bench_llamacpp_vulkan(lab, lengths, repeats, decode_tokens, say)
                if vk is not None:
                    out["llamacpp-vulkan"] = vk
    finally:
        say.close()
    file_mb = lab.path.stat().st_size / 2**20
    return BenchReport(lab.name, get_device().name, repeats, out, ops, ops_at, dec_ops, cpu_model(), file_mb,
                       dict(variants or {}), batch_figures)  # fmt: skip


def save(report: BenchReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=1))
