"""Benchmarks: load, prefill and decode for the GPU path and the numpy reference, in one run.

Figures are reported as ratios against the reference measured in the same run,
and against llama.cpp's golden timings when a golden file carries them.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from labkit.lab import open as open_lab

GOLDEN_DIR = resources.files("labkit") / "data" / "golden"  # package data


def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM, not getrusage: ru_maxrss survives exec, so a
    child of a big process (pytest) would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
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
        """Speed ratios (> 1: the GPU path is faster): prefill time and decode rate."""
        g, r = self.gpu, self.reference
        out = {
            "prefill_speedup_gpu_vs_reference": r.prefill_s / g.prefill_s,
            "decode_speedup_gpu_vs_reference": g.decode_tok_s / r.decode_tok_s,
        }
        if self.llamacpp:
            out["prefill_speedup_gpu_vs_llamacpp"] = self.llamacpp["prefill_s"] / g.prefill_s
            out["decode_speedup_gpu_vs_llamacpp"] = g.decode_tok_s / self.llamacpp["decode_tok_s"]
        return out

    def to_dict(self) -> dict:
        return dict(asdict(self), ratios=self.ratios())

    @classmethod
    def from_dict(cls, data: dict) -> BenchResult:
        """The inverse of to_dict (`labkit bench --json` output); the ratios are derived again."""
        fields = {k: v for k, v in data.items() if k != "ratios"}
        return cls(**{**fields, "gpu": EngineFigures(**data["gpu"]), "reference": EngineFigures(**data["reference"])})

    def table(self) -> str:
        rows = [f"{self.model} on {self.adapter}: {self.n_prompt_tokens}-token prefill, {self.n_decode_tokens} decoded"]
        rows.append(f"{'engine':10} {'load s':>8} {'prefill s':>10} {'decode tok/s':>13} {'peak RSS MB':>12}")
        for name, f in (("gpu", self.gpu), ("reference", self.reference)):
            rows.append(f"{name:10} {f.load_s:8.2f} {f.prefill_s:10.3f} {f.decode_tok_s:13.2f} {f.peak_rss_mb:12.0f}")
        if self.llamacpp:
            lc = self.llamacpp
            load = f"{lc['load_s']:8.2f}" if "load_s" in lc else f"{'':8}"
            rows.append(f"{'llama.cpp':10} {load} {lc['prefill_s']:10.3f} {lc['decode_tok_s']:13.2f}")
        rows += [f"{k}: {v:.2f}" for k, v in self.ratios().items()]
        return "\n".join(rows)


def measure_llamacpp(path: Path, ids: list[int], new_tokens: int, threads: int = 2) -> dict | None:
    """llama.cpp on the same file and token ids, in this process (extra "oracle"); None without it."""
    try:
        import llama_cpp
    except ImportError:
        return None
    import numpy as np

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_batch=512, verbose=False)
    load = time.perf_counter() - t0
    llm.eval(ids)  # warm-up
    llm.reset()
    t1 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t1
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t2 = time.perf_counter()
    for _ in range(max(new_tokens - 1, 1)):
        llm.eval([nxt])
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    decode = time.perf_counter() - t2
    llm.close()
    return {"load_s": load, "prefill_s": prefill, "decode_tok_s": max(new_tokens - 1, 1) / decode, "live": True}


def run_bench(model: str = "gemma3-270m", prompt: str = "The color of the sky is", new_tokens: int = 8) -> BenchResult:
    """GPU first (so its peak RSS is not the reference's cached float64 weights), then the reference."""
    t0 = time.perf_counter()
    lab = open_lab(model)
    lab.executor.upload_all()
    gpu_load = time.perf_counter() - t0
    lab.generate(prompt, max_new_tokens=2)  # warm-up: pipelines compiled for prefill and decode
    # prefill as llama.cpp measures it: the prompt through the KV cache, logits of the last position
    gen = lab.generate(prompt, max_new_tokens=new_tokens)
    gpu = EngineFigures(gpu_load, gen.timings["prefill_s"], gen.timings["decode_tok_s"], peak_rss_mb())

    t2 = time.perf_counter()
    ref_lab = open_lab(model)
    ref_lab.reference(prompt, names=["logits"])  # first call dequantizes and caches the weights
    ref_load = time.perf_counter() - t2
    rgen = ref_lab.generate_reference(prompt, max_new_tokens=new_tokens)
    ref = EngineFigures(ref_load, rgen.timings["prefill_s"], rgen.timings["decode_tok_s"], peak_rss_mb())

    llamacpp = measure_llamacpp(lab.path, gen.prompt_ids, new_tokens)
    if llamacpp is None:  # not installed: llama.cpp's figures from the golden file, if it has them
        golden = GOLDEN_DIR / f"{lab.name}.json"
        if golden.is_file():
            for entry in json.loads(golden.read_text())["prompts"]:
                if entry["text"] == prompt and entry.get("prefill_s"):
                    llamacpp = {"prefill_s": entry["prefill_s"], "decode_tok_s": entry["decode_tok_s"], "live": False}
    from labkit.gpu.device import get_device

    return BenchResult(lab.name, prompt, len(gen.prompt_ids), len(gen.ids), gpu, ref, llamacpp, get_device().name)
