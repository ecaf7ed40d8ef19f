"""`labkit.attribute` against the float64 reference pass it is measured by: a GPU run of a long
Gemma prompt, attributed stage by stage (each stage recomputed twice from the run's own inputs:
exactly and with f32 emulated), timed beside the reference pass of the same tokens, in one process.

    .venv/bin/python benchmarks/bench_attribute.py [--model gemma3-270m] [--tokens 512] [--repeats 3]

Prints one JSON object: medians in seconds and the ratio attribute / reference (the issue's target
is at most 2). Run nothing else meanwhile: on 2 cores a second job halves every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import labkit


def _median_s(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _cpu() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    lab = labkit.open(a.model)
    ids = np.random.default_rng(0).integers(100, lab.config.vocab_size, a.tokens).tolist()
    run = lab.run(ids)  # every stage captured, the attention maps included
    lab.reference(ids[:8])  # warm-up: the reference's weight cache is filled once
    ref_s, ref = _median_s(lambda: lab.reference(ids, names=sorted(run.captures)), a.repeats)
    att_s, att = _median_s(lambda: labkit.attribute(run, lab, reference=ref), a.repeats)
    print(json.dumps({
        "model": a.model, "tokens": a.tokens, "cpu": _cpu(), "stages_attributed": len(att.rows),
        "guilty": att.guilty, "largest_local_over_limit": round(max(r.ratio for r in att.rows), 3),
        "reference_s": round(ref_s, 2), "attribute_s": round(att_s, 2),
        "attribute_over_reference": round(att_s / ref_s, 2),
        "attribute_with_its_reference_over_reference": round((att_s + ref_s) / ref_s, 2),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
