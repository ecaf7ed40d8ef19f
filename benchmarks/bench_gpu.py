"""On a real GPU (a session lent one): the real-size shaped files, each through `labkit bench` in a
process of its own, with the device memory it peaked at.

For each shape: the GPU path's prefill (logits at every position, every stage captured, the last
position only), decode, the GPU time per kernel family at prefill and for one decode step, and
llama.cpp's CPU figures on every core of the same host, in the same run. Device memory is read
from `nvidia-smi` every 50 ms while the process runs, less what the device held before it; where
there is no `nvidia-smi` (lavapipe) it is left out. Decode is 64 tokens, 3 times, after the prefills
have brought the GPU's clocks up: 16-token decodes on an H200 swung 2x with its clock state.

    .venv/bin/python benchmarks/bench_gpu.py [--shapes llama-3.2-1b,llama-3.1-8b,...] [--out DIR]

The files are written once into ~/.cache/labkit/shaped by bench_real_size.shaped_file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_size import PLANS, shaped_file  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
SHAPES = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b")


class DeviceMemory:
    """The device's used memory, sampled by nvidia-smi in a thread: its peak above the start."""

    def __init__(self) -> None:
        self.smi = shutil.which("nvidia-smi")
        self.base = self.read() if self.smi else None
        self.peak = self.base
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def read(self) -> int | None:
        q = [self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        p = subprocess.run(q, capture_output=True, text=True)
        return int(p.stdout.split()[0]) * 2**20 if p.returncode == 0 and p.stdout.strip() else None

    def sample(self) -> None:
        while not self.done.wait(0.05):
            now = self.read()
            if now is not None and (self.peak is None or now > self.peak):
                self.peak = now

    def __enter__(self) -> DeviceMemory:
        if self.smi:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.smi:
            self.thread.join()

    @property
    def peak_bytes(self) -> int | None:
        return None if self.base is None or self.peak is None else self.peak - self.base


def bench_shape(name: str, engines: str, repeats: int, timeout: int, variants: list[str]) -> dict:
    plan = PLANS[name]
    path = shaped_file(name, plan.get("mix", "Q4_K_M"), plan.get("layers"))
    lengths = ",".join(str(n) for n in plan["lengths"])
    cmd = [sys.executable, "-m", "labkit.cli", "bench", str(path), "--json", "--engines", engines,
           "--lengths", lengths, "--repeats", str(repeats), "--decode-tokens", "64",
           *(a for v in variants for a in ("--variant", v))]  # fmt: skip
    t0 = time.perf_counter()
    with DeviceMemory() as mem:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"shape": name, "error": f"timed out after {timeout} s"}
    out = {"shape": name, "layers": plan.get("layers"), "wall_s": time.perf_counter() - t0}
    if p.returncode != 0:
        return {**out, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return {**out, "report": json.loads(p.stdout), "device_peak_bytes": mem.peak_bytes}


def table(row: dict) -> str:
    if "error" in row:
        return f"{row['shape']}: error: {row['error']}"
    r = row["report"]
    eng, mb = r["engines"], r.get("file_mb") or 0
    where = f"{r['adapter']}; CPU {r['cpu']}"
    lines = [f"{row['shape']} ({row.get('layers') or 'all'} layers, {mb / 1024:.2f} GiB): {where}"]
    if r.get("variants"):
        lines.append("  kernels: " + ", ".join(f"{k}={v}" for k, v in r["variants"].items()))
    for name, e in eng.items():
        pre = ", ".join(f"T={f['length']}: {f['logits_all_s']:.3f} s" for f in e["lengths"] if f.get("logits_all_s"))
        dec = f"{e['decode_tok_s']:.1f} tok/s" if e.get("decode_tok_s") else "-"
        lines.append(f"  {name:9} load {e['load_s']:.1f} s; prefill {pre}; decode {dec}")
    lines += ratios(eng)
    if row.get("device_peak_bytes") is not None:
        gib = row["device_peak_bytes"] / 2**30
        lines.append(f"  peak device memory {gib:.2f} GiB ({gib * 1024 / mb:.2f}x the file)")
    for key, what in (("op_families", f"prefill T={r['op_families_at']}"), ("decode_op_families", "decode step")):
        top = [f"{o['family']} {o['ms']:.2f} ms" + (f" ({o['gbps']:.0f} GB/s)" if o.get("gbps") else "")
               for o in r.get(key, [])[:5]]  # fmt: skip
        lines.append(f"  {what}: {', '.join(top)}")
    return "\n".join(lines)


def ratios(eng: dict) -> list[str]:
    """The GPU's time over llama.cpp's (prefill) and its rate over llama.cpp's (decode), same run."""
    if "gpu" not in eng or "llamacpp" not in eng:
        return []
    gpu, cpp = eng["gpu"], eng["llamacpp"]
    out = [
        f"  gpu/llama.cpp prefill T={g['length']}: {g['logits_all_s'] / c['logits_all_s']:.2f}"
        for g, c in zip(gpu["lengths"], cpp["lengths"])
        if g.get("logits_all_s") and c.get("logits_all_s")
    ]
    if gpu.get("decode_tok_s") and cpp.get("decode_tok_s"):
        out.append(f"  gpu/llama.cpp decode rate: {gpu['decode_tok_s'] / cpp['decode_tok_s']:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--engines", default="gpu,llamacpp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per shape")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--variant", action="append", default=[], metavar="OP=NAME", help="GPU kernels, as labkit bench")
    ap.add_argument("--tag", default="", help="names the results file: bench-gpu[-TAG].json")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.shapes.split(","):
        rows.append(bench_shape(name, args.engines, args.repeats, args.timeout, args.variant))
        (args.out / f"bench-gpu{'-' + args.tag if args.tag else ''}.json").write_text(json.dumps(rows, indent=1))
        print(table(rows[-1]), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("LABKIT_PROGRESS", "0")
    main()
