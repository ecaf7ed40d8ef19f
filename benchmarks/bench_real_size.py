"""Real sizes: random-weight files with the public shapes of Llama-3.2-1B and Llama-3.1-8B (all
their layers, Q4_K_M-like storage, written once into ~/.cache/labkit/shaped, never into git),
each engine in a process of its own so that its peak RSS is its own:

- the GPU path: prefill, decode and peak RSS against the file's size, in its default layout
  (blocks for the K-quants) and in the int8 layout (`gpu_int8`);
- the float64 reference: prefill and peak RSS, with the default budget and with a set one;
- llama.cpp (the `oracle` extra): prefill and decode;
- `llamacpp-vulkan`, asked for with --engines (make peer-vulkan): llama.cpp's own Vulkan backend on the
  adapter labkit uses, every layer offloaded (prefill of the last position's logits, and decode);
- `compare` of a GPU pass and a reference pass, 16 tokens, in one process (under 10 GB for 8B).

Figures are medians of `--repeats` after a warm-up; ratios are taken within this run, against
the reference. The host CPU is printed with them (lavapipe's speed moves 2-3x with it).

    .venv/bin/python benchmarks/bench_real_size.py [--shapes llama-3.2-1b,llama-3.1-8b] [--engines gpu,...]
        [--mixes Q4_K_M,Q2_K,IQ4_XS,TQ2_0]   (each type's file beside its Q4_K_M twin; decode ratios)

Run nothing else meanwhile: on 2 cores a second job halves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "labkit" / "shaped"
OUT = Path(__file__).resolve().parent / "results"
# per shape: prompt lengths, the reference's set budget, decode tokens
PLANS = {
    "llama-3.2-1b": {"lengths": [64, 512], "ref_memory": "3GB", "decode": 16},
    "llama-3.1-8b": {"lengths": [16, 64], "ref_memory": "6GB", "decode": 8, "gpu_memory": "6GB", "int8_memory": "20GB"},
    # a mixture of experts: 2 of its 48 layers (1.2 GB), 128 experts of which 8 per token
    "qwen3-30b-a3b": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 2, "no_int8": True},
    # Granite-4.0-H-Tiny: all 40 layers (36 Mamba-2, 4 attention), 64 experts of which 6 per token
    "granite-4.0-h-tiny": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "no_int8": True},
    # Qwen3.5-4B, 9B and 35B-A3B: 4 of their layers (3 gated delta nets, then a gated attention, as the
    # models start), the MoE's 256 experts of which 8 per token beside a gated shared one
    "qwen3.5-4b": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 4, "no_int8": True},
    "qwen3.5-9b": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 4, "no_int8": True},
    "qwen3.5-35b-a3b": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 4, "no_int8": True},
    # Qwen3-Next-80B-A3B: 4 of its 48 layers, 512 experts of which 10 per token
    "qwen3-next-80b-a3b": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 4, "no_int8": True},
    # DeepSeek-V3: 2 of its 61 layers (both dense: its first 3 are), latent attention at full width (128 heads, a
    # 512 latent, YaRN x40), a 129k vocabulary
    "deepseek-v3": {"lengths": [16, 64], "ref_memory": "3GB", "decode": 8, "layers": 2, "no_int8": True},
    # gpt-oss-20b: 2 of its 24 layers as OpenAI ships it (MXFP4 experts, Q8_0 elsewhere), 32 experts, 4 per token
    "gpt-oss-20b": {
        "lengths": [16, 64],
        "ref_memory": "3GB",
        "decode": 8,
        "layers": 2,
        "no_int8": True,
        "mix": "MXFP4_MOE",
    },
}

ENGINE = r"""
import json, statistics, sys, time
import labkit
from labkit.bench import peak_rss_mb, prompt_of
engine, path, memory, lengths, decode, repeats = sys.argv[1], sys.argv[2], sys.argv[3] or None, \
    json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
lab = labkit.open(path, memory=memory)
if engine == "gpu_int8":  # the int8 layout, against the default blocks layout of the K-quants
    for fmt in ("q4_k", "q5_k", "q6_k"):
        lab.use(f"matmul_{fmt}", "repacked")
out = {"engine": engine, "memory": memory, "prefill_s": {}, "file_bytes": lab.path.stat().st_size}
def med(fn):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
t0 = time.perf_counter()
if engine.startswith("gpu"):
    lab.run(prompt_of(lab, 4), names=["logits"])  # a first pass: fits the weights to the budget, uploads them
    out["load_s"] = time.perf_counter() - t0
    out["weight_layout"] = lab.executor.weight_layout
    out["gpu_weight_bytes"] = lab.executor.gpu_bytes()
    for n in lengths:
        ids = prompt_of(lab, n)
        out["prefill_s"][n] = med(lambda: (lab.forget_last_pass(), lab.run(ids, names=["logits"], timestamps=False)))
    # the first generate compiles the decode kernels (about 0.1 s each on lavapipe): reported apart,
    # and the decode rate is taken after it, as `labkit bench` and llama-bench take theirs
    out["decode_cold_tok_s"] = lab.generate(prompt_of(lab, 8), max_new_tokens=decode).timings["decode_tok_s"]
    warm = lab.generate(prompt_of(lab, 8), max_new_tokens=decode).timings
    out["decode_tok_s"] = warm["decode_tok_s"]
    out["host_ms_per_step"], out["dispatches_per_step"] = warm["host_ms_per_step"], warm["dispatches_per_step"]
    out["recorded_ahead"] = warm["recorded_ahead"]
elif engine == "reference":
    for n in lengths:
        ids = prompt_of(lab, n)
        out["prefill_s"][n] = med(lambda: lab.reference(ids, names=["logits"]))
    out["weight_cache_bytes"] = lab.reference_engine.weights.nbytes
    out["weight_dtype"] = str(lab.reference_engine.weights.dtype)
elif engine == "llamacpp":
    from labkit.bench.engines import bench_llamacpp
    f = bench_llamacpp(lab, tuple(lengths), repeats, decode, lambda msg: None)
    out["prefill_s"] = {x.length: x.logits_all_s for x in f.lengths}
    out["decode_tok_s"] = f.decode_tok_s
elif engine == "llamacpp-vulkan":  # llama.cpp's Vulkan backend on labkit's adapter (make peer-vulkan)
    from labkit.bench.vulkan_peer import run_peer
    got = run_peer(lab.path, lengths, repeats, decode)
    if "error" in got:
        raise SystemExit(got["error"])
    out["prefill_s"] = {int(n): s for n, s in got["prefill_s"].items()}
    out["decode_tok_s"], out["detail"] = got["decode_tok_s"], f"{got['device']}, {got['llamacpp']}"
elif engine == "compare":
    ids = prompt_of(lab, lengths[0])
    run = lab.run(ids)
    ref = lab.reference(ids)
    cmp = labkit.compare(run, ref)
    out["passed"], out["first_divergence"] = cmp.passed, cmp.first_divergence
out["peak_rss_bytes"] = peak_rss_mb() * 2**20
print(json.dumps(out))
"""


def shaped_file(name: str, mix: str = "Q4_K_M", layers: int | None = None) -> Path:
    """The shape's file in `mix` (Q4_K_M, or one GGUF type for every layer matrix), `layers` of its
    layers (all by default), written once."""
    from labkit.model.shaped import write_shaped_model

    stem = name + (f"-{mix.lower()}" if mix != "Q4_K_M" else "") + (f"-{layers}l" if layers else "")
    path = CACHE / f"{stem}.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (random weights, public shape)", file=sys.stderr)
        write_shaped_model(path.with_suffix(".part"), name, n_layers=layers, mix=mix).rename(path)
    return path


def one(engine: str, path: Path, memory: str | None, lengths, decode: int, repeats: int) -> dict:
    args = [engine, str(path), memory or "", json.dumps(lengths), str(decode), str(repeats)]
    p = subprocess.run([sys.executable, "-c", ENGINE, *args], capture_output=True, text=True,
                       env={**os.environ, "LABKIT_PROGRESS": "0"})  # fmt: skip
    if p.returncode != 0:
        return {"engine": engine, "memory": memory, "error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_shape(
    name: str, repeats: int, engines: set[str], mix: str = "Q4_K_M", decode: int | None = None
) -> list[dict]:
    plan = PLANS[name]
    path = shaped_file(name, mix, plan.get("layers"))
    L, dec = plan["lengths"], decode or plan["decode"]
    runs = [("gpu", None, L, dec, repeats)]
    if plan.get("gpu_memory"):  # the GPU path under a budget near the file's size
        runs.append(("gpu", plan["gpu_memory"], L[:1], 4, 1))
    if not plan.get("no_int8"):  # experts are read as their GGUF bytes: no int8 layout to compare
        runs.append(("gpu_int8", plan.get("int8_memory"), L, dec, repeats))
    runs += [
        ("reference", None, L, 0, repeats),
        ("reference", plan["ref_memory"], L[-1:], 0, 1),
        ("llamacpp", None, L, dec, repeats),
        ("llamacpp-vulkan", None, L, dec, repeats),
    ]
    runs.append(("compare", "10GB" if name == "llama-3.1-8b" else None, [16], 0, 0))
    return [one(e, path, *rest) for e, *rest in runs if e in engines]


def table(name: str, rows: list[dict], cpu: str) -> str:
    ref = next((r for r in rows if r["engine"] == "reference" and not r.get("memory")), {})
    lines = [f"{name}: {rows[0].get('file_bytes', 0) / 2**30:.2f} GiB file; host CPU {cpu}"]
    for r in rows:
        if "error" in r:
            lines.append(f"  {r['engine']:10} {r.get('memory') or 'default':8} error: {r['error']}")
            continue
        pre = ", ".join(
            f"T={n}: {s:.2f} s" + (f" ({s / ref['prefill_s'][n]:.2f}x ref)" if ref.get("prefill_s", {}).get(n) else "")
            for n, s in r.get("prefill_s", {}).items()
        )
        dec = f"; decode {r['decode_tok_s']:.2f} tok/s" if r.get("decode_tok_s") else ""
        if r.get("decode_cold_tok_s"):
            dec += f" ({r['decode_cold_tok_s']:.2f} with the first generate's kernel compiles)"
        if r.get("host_ms_per_step") is not None:
            dec += f", {r['host_ms_per_step']:.2f} ms host per step, {r['dispatches_per_step']:.0f} dispatches"
            dec += " (recorded ahead)" if r.get("recorded_ahead") else ""
        rss = r["peak_rss_bytes"]
        extra = f"; passed={r['passed']} first divergence {r['first_divergence']}" if "passed" in r else ""
        if "weight_layout" in r:
            extra += f"; weights {r['gpu_weight_bytes'] / 1e9:.2f} GB as {r['weight_layout']}, load {r['load_s']:.0f} s"
        if "weight_dtype" in r:
            extra += f"; weights held {r['weight_cache_bytes'] / 1e9:.2f} GB {r['weight_dtype']}"
        lines.append(f"  {r['engine']:10} {r.get('memory') or 'default':8} {pre}{dec}; peak RSS "
                     f"{rss / 1e9:.2f} GB ({rss / r['file_bytes']:.2f}x the file){extra}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    from labkit.bench import cpu_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(PLANS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engines", default="gpu,gpu_int8,reference,llamacpp,compare")
    mixes = "Q4_K_M and/or GGUF types for every layer matrix (Q2_K,...); default: the shape's own mix"
    ap.add_argument("--mixes", default=None, help=mixes)
    ap.add_argument("--decode", type=int, default=None, help="tokens per decode run (default: the shape's own)")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    decode = {}
    for name in args.shapes.split(","):
        for mix in args.mixes.split(",") if args.mixes else [PLANS[name].get("mix", "Q4_K_M")]:
            rows = bench_shape(name, args.repeats, set(args.engines.split(",")), mix, args.decode)
            tag = name if mix == "Q4_K_M" else f"{name}-{mix.lower()}"
            (OUT / f"real-size-{tag}.json").write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
            print(table(f"{name} {mix}", rows, cpu_model()), flush=True)
            decode[name, mix] = {r["engine"]: r.get("decode_tok_s") for r in rows if not r.get("memory")}
    for (name, mix), d in decode.items():  # each type's decode against its Q4_K_M twin's, same run
        twin = decode.get((name, "Q4_K_M"), {})
        ratios = [f"{e} {d[e] / twin[e]:.2f}x" for e in d if d.get(e) and twin.get(e)]
        if mix != "Q4_K_M" and ratios:
            print(f"{name} {mix} decode vs its Q4_K_M twin: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
