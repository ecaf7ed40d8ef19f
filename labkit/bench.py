"""Benchmarks: load, prefill and decode for the GPU path and the numpy reference, in one run.

Figures are reported as ratios against the reference measured in the same run,
and against llama.cpp's golden timings when a golden file carries them.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.lab import open as open_lab

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class EngineFigures:
    load_s: float
    prefill_s: float
    decode_tok_s: float
    peak_rss_mb: float


@dataclass
class BenchResult:
    model: str
    prompt: str
    n_prompt_tokens: int
    n_decode_tokens: int
    gpu: EngineFigures
    reference: EngineFigures
    llamacpp: dict | None
    adapter: str

    def ratios(self) -> dict[str, float]:
        g, r = self.gpu, self.reference
        return {
            "prefill_gpu_over_reference": g.prefill_s / r.prefill_s,
            "decode_gpu_over_reference": g.decode_tok_s / r.decode_tok_s,
        }

    def to_dict(self) -> dict:
        return dict(asdict(self), ratios=self.ratios())

    def table(self) -> str:
        rows = [f"{self.model} on {self.adapter}: {self.n_prompt_tokens}-token prefill, {self.n_decode_tokens} decoded"]
        rows.append(f"{'engine':10} {'load s':>8} {'prefill s':>10} {'decode tok/s':>13} {'peak RSS MB':>12}")
        for name, f in (("gpu", self.gpu), ("reference", self.reference)):
            rows.append(f"{name:10} {f.load_s:8.2f} {f.prefill_s:10.3f} {f.decode_tok_s:13.2f} {f.peak_rss_mb:12.0f}")
        if self.llamacpp:
            lc = self.llamacpp
            rows.append(f"{'llama.cpp':10} {'':8} {lc['prefill_s']:10.3f} {lc['decode_tok_s']:13.2f}")
        rows += [f"{k}: {v:.2f}" for k, v in self.ratios().items()]
        return "\n".join(rows)


def run_bench(model: str = "gemma3-270m", prompt: str = "The color of the sky is", new_tokens: int = 8) -> BenchResult:
    """GPU first (so its peak RSS is not the reference's cached float64 weights), then the reference."""
    t0 = time.perf_counter()
    lab = open_lab(model)
    lab.executor.upload_all()
    gpu_load = time.perf_counter() - t0
    lab.run(prompt, names=["logits"])  # warm-up: pipelines compiled
    t1 = time.perf_counter()
    lab.run(prompt, names=["logits"], timestamps=False)
    gpu_prefill = time.perf_counter() - t1
    gen = lab.generate(prompt, max_new_tokens=new_tokens)
    gpu = EngineFigures(gpu_load, gpu_prefill, gen.timings["decode_tok_s"], peak_rss_mb())

    t2 = time.perf_counter()
    ref_lab = open_lab(model)
    ref_lab.reference(prompt, names=["logits"])  # first call dequantizes and caches the weights
    ref_load = time.perf_counter() - t2
    t3 = time.perf_counter()
    ref_lab.reference(prompt, names=["logits"])
    ref_prefill = time.perf_counter() - t3
    rgen = ref_lab.generate_reference(prompt, max_new_tokens=new_tokens)
    ref = EngineFigures(ref_load, ref_prefill, rgen.timings["decode_tok_s"], peak_rss_mb())

    llamacpp = None
    golden = GOLDEN_DIR / f"{lab.name}.json"
    if golden.exists():
        for entry in json.loads(golden.read_text())["prompts"]:
            if entry["text"] == prompt and entry.get("prefill_s"):
                llamacpp = {"prefill_s": entry["prefill_s"], "decode_tok_s": entry["decode_tok_s"]}
    from labkit.gpu.device import get_device

    return BenchResult(lab.name, prompt, len(gen.prompt_ids), len(gen.ids), gpu, ref, llamacpp, get_device().name)
