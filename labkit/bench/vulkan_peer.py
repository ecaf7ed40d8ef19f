"""llama.cpp's own Vulkan backend as a bench peer, on the adapter labkit uses (`make peer-vulkan`
installs it: the prebuilt `cyllama-vulkan` wheel, llama.cpp with ggml-vulkan inside).

The fair peer of a WebGPU engine on a GPU is llama.cpp's Vulkan backend on the same card, through
the same driver; here that is lavapipe, which ggml-vulkan accepts once GGML_VK_VISIBLE_DEVICES
names it (device 0 by default: set it to pick another adapter). The peer runs in its own process
(`python -m labkit.bench.vulkan_peer FILE ...`): its libllama must not meet llama-cpp-python's in
one address space. It offloads every layer, prefills each length once to warm its pipelines and then
times `repeats` prefills (the last position's logits, synchronized), and times decode steps, each
synchronized, on given token ids (nothing is sampled: a step's cost does not depend on its token). It prints
one JSON object: the device it ran on, llama.cpp's revision, load seconds, prefill seconds per
length and decode tok/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VERSION = "0.2.18"  # the cyllama-vulkan wheel `make peer-vulkan` installs


def measure(path: Path, lengths: list[int], repeats: int, decode_tokens: int) -> dict:
    """The peer's figures, in this process (the module's command line calls it)."""
    import cyllama.llama.llama_cpp as cy
    import numpy as np

    cy.disable_logging()
    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    gpus = [d for d in cy.ggml_backend_dev_info() if d["type"] == "GPU"]
    if not gpus:
        return {"error": "llama.cpp's Vulkan backend found no Vulkan device"}
    t0 = time.perf_counter()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 999  # every layer on the Vulkan device
    model = cy.LlamaModel(str(path), mp)
    cp = cy.LlamaContextParams()
    cp.n_ctx = max(lengths) + decode_tokens + 16
    cp.n_batch = cp.n_ubatch = max(512, max(lengths))
    cp.n_threads = cp.n_threads_batch = len(os.sched_getaffinity(0))
    ctx = cy.LlamaContext(model, cp)
    load = time.perf_counter() - t0
    ids = list(range(10, 10 + max(lengths)))

    def prefill(n: int) -> float:
        ctx.kv_cache_clear()
        t = time.perf_counter()
        ctx.decode(cy.llama_batch_get_one(ids[:n], 0))
        ctx.synchronize()
        return time.perf_counter() - t

    out = {}
    for n in lengths:
        prefill(n)  # its pipelines compiled and its buffers allocated
        out[str(n)] = float(np.median([prefill(n) for _ in range(repeats)]))
    prefill(8)
    steps = []
    for i in range(decode_tokens):
        t = time.perf_counter()
        ctx.decode(cy.llama_batch_get_one([ids[i % len(ids)]], 8 + i))
        ctx.synchronize()
        steps.append(time.perf_counter() - t)
    warm = steps[2:] if len(steps) > 4 else steps
    return {"device": gpus[0]["description"], "llamacpp": f"ggml {cy.ggml_version()} ({cy.ggml_commit()})",
            "wheel": f"cyllama-vulkan {VERSION}", "load_s": load, "prefill_s": out,
            "decode_tok_s": float(1.0 / np.median(warm))}  # fmt: skip


def run_peer(path: Path, lengths: list[int], repeats: int, decode_tokens: int, timeout: int = 1800) -> dict:
    """The peer's figures from its own process; {"error": why} when it is not installed or fails."""
    try:
        import importlib.util

        if importlib.util.find_spec("cyllama") is None:
            return {"error": f"llama.cpp's Vulkan peer is not installed (make peer-vulkan: cyllama-vulkan {VERSION})"}
    except ImportError:
        return {"error": "llama.cpp's Vulkan peer is not installed (make peer-vulkan)"}
    cmd = [sys.executable, "-m", "labkit.bench.vulkan_peer", str(path), "--lengths", ",".join(map(str, lengths)),
           "--repeats", str(repeats), "--decode-tokens", str(decode_tokens)]  # fmt: skip
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"llama.cpp's Vulkan peer ran past {timeout} s"}
    last = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not last:
        why = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()][-1:] or [f"exit {done.returncode}"]
        return {"error": f"llama.cpp's Vulkan peer failed: {why[0]}"}
    return json.loads(last[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.bench.vulkan_peer")
    ap.add_argument("model", type=Path)
    ap.add_argument("--lengths", default="8,128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=16)
    a = ap.parse_args(argv)
    if a.decode_tokens < 1 or a.repeats < 1:
        ap.error("--decode-tokens and --repeats take at least 1")
    lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    print(json.dumps(measure(a.model, lengths, a.repeats, a.decode_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
