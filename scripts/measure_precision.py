"""Measure the f16 and bf16 threshold tables of labkit.precision.

An engine that keeps its activations in f16 (or bf16) rounds every stage's output before the
next stage reads it. This runs the float64 reference that way
(ReferenceEngine.forward with `each=` rounding every stage's output), compares it with the plain float64
reference, and prints the worst NMSE per stage kind over both real models and a few prompts,
then the thresholds: the worst times 4, rounded up to 1-2-5, and never below the f32 table.
A run that overflows (Gemma 3's activations exceed f16's 65 504) counts only up to the first
stage with an inf or NaN: an f16 engine there is broken, not imprecise.

    .venv/bin/python scripts/measure_precision.py
"""

from __future__ import annotations

import math

import numpy as np

import labkit
from labkit.captures import Run, stage_kind
from labkit.precision import REFERENCE_THRESHOLDS

PROMPTS = (
    "The color of the sky is",
    "In 1969, 3 astronauts flew 384,400 km to the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
)


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (nearest, ties to even) and widen back: the top 16 bits of an f32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


ROUND = {"float16": lambda a: a.astype(np.float16).astype(np.float64), "bfloat16": round_bf16}


def round_up_125(x: float) -> float:
    e = math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * 10**e >= x:
            return m * 10**e
    return 10 ** (e + 1)


def main() -> None:
    worst: dict[str, dict[str, float]] = {p: {} for p in ROUND}
    for model in ("gemma3-270m", "smollm2-135m"):
        lab = labkit.open(model)
        for prompt in PROMPTS:
            ids = lab.tokenize(prompt)
            ref = lab.reference(ids)
            for precision, rounding in ROUND.items():
                with np.errstate(over="ignore"):  # Gemma overflows f16: counted below, not warned about
                    caps = lab.reference_engine.forward(ids, each=rounding)
                run = Run(lab.name, "rounded", ids, lab.stages, caps)
                cmp = labkit.compare(run, ref, thresholds={k: math.inf for k in REFERENCE_THRESHOLDS})
                for r in cmp.rows:
                    if r.reason:  # NaN or inf: the precision overflowed (Gemma in f16); not a rounding error
                        print(f"{model} {precision}: overflows from {r.stage} ({r.reason}); later stages left out")
                        break
                    w = worst[precision]
                    w[stage_kind(r.stage)] = max(w.get(stage_kind(r.stage), 0.0), r.nmse)
                print(f"{model} {len(ids):3} tokens {precision}: top-1 {run.top(1)[0].id} vs {ref.top(1)[0].id}")
    for precision, w in worst.items():
        print(f"\n{precision}: kind, worst NMSE, threshold")
        for kind, x in w.items():
            print(f"    {kind!r}: {max(REFERENCE_THRESHOLDS[kind], round_up_125(4 * x)):.0e},  # worst {x:.1e}")


if __name__ == "__main__":
    main()
