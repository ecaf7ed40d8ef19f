"""How precise a run is, and so how far it may sit from another run before a stage fails.

Every Run carries a precision: the float64 reference, an f32 GPU pass, an engine's f16 or
bf16 dumps, or an engine that quantizes activations to 8 bits inside its matmuls (llama.cpp).
Each precision has a table of max NMSE per stage kind against the float64 reference, and
`compare` uses, per stage kind, the looser of its two sides' tables. So a GPU run against the
reference, an oracle run, or an f16 dump each get bounds that fit them without the caller
passing any, and a comparison states which table it used.
"""

from __future__ import annotations

from labkit.errors import InvalidArgumentError
from labkit.model.stage_kinds import thresholds

# Stage kind → max NMSE against the float64 reference for an f32 GPU pass.
# Elementwise ops are tight; matmuls carry f32 accumulation over K and the
# upstream error of the whole chain, so they get test-backend-ops' mul_mat bound.
REFERENCE_THRESHOLDS: dict[str, float] = thresholds("float32")  # labkit.model.stage_kinds
DEFAULT_THRESHOLD = 1e-6


# Max NMSE per stage kind against llama.cpp. llama.cpp quantizes each matmul's input
# activations to 8 bits (Q8_0/Q8_1 blocks of 32) and keeps its KV cache in F16, so every
# stage after the first matmul carries that error, and it grows with depth: 1e-5 to 1e-4
# at layer 0, 1e-3 to 1e-2 in the last layers. labkit's float64 reference and its f32
# GPU pass sit at the same distance from llama.cpp (their worst NMSE agree to 3 digits).
# Measured: worst over all layers, gemma3-270m and smollm2-135m, 8 prompts of 1 to 58
# tokens, reference and GPU runs (per model in docs/llamacpp_names.md). Thresholds are
# the worst times about 3-5, rounded up to 1-2-5; on 6 held-out prompts (data/golden)
# the largest NMSE/threshold is 0.42 (gemma3 post_attn_norm 2.1e-2). Only embed and layer 0's attn_norm
# come before any quantized matmul; embed keeps the float threshold. A wrong rope style,
# a flipped sign or a wrong attention scale gives 2e-1 to 1e2 at the faulty stage;
# faults below about 2e-2 (an off-by-one rope position) need the float64 reference.
INT8_ACTIVATION_THRESHOLDS: dict[str, float] = thresholds("int8")  # labkit.model.stage_kinds


# An engine that keeps activations in f16 (or bf16) between stages rounds every stage's
# output to 11 (or 8) significant bits and carries that rounding through the layers. Measured
# (scripts/measure_precision.py): the float64 reference with every stage's output rounded to f16 or bf16
# before the next stage reads it, against the float64 reference, worst over both real models
# and 3 prompts of 6 to 40 tokens (Gemma in f16 only up to layer 7, where its residual
# overflows f16: an f16 engine there is broken, not imprecise). The table is the worst times
# about 4, rounded up to 1-2-5, and never tighter than the f32 table. A wrong sign, rope
# style or scale gives 1e-1 and more; bf16's 8 bits hide faults below about 5e-2, as 8-bit
# activations do.
FLOAT16_THRESHOLDS: dict[str, float] = thresholds("float16")  # labkit.model.stage_kinds
BFLOAT16_THRESHOLDS: dict[str, float] = thresholds("bfloat16")  # labkit.model.stage_kinds

PRECISIONS: dict[str, dict[str, float]] = {
    "float64": REFERENCE_THRESHOLDS,  # the tightest table: against float64 only the other side's error counts
    "float32": REFERENCE_THRESHOLDS,
    "float16": FLOAT16_THRESHOLDS,
    "bfloat16": BFLOAT16_THRESHOLDS,
    "int8-activations": INT8_ACTIVATION_THRESHOLDS,
}
# Looser first: the order `looser` uses to name the table it picked.
_ORDER = ("int8-activations", "bfloat16", "float16", "float32", "float64")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise InvalidArgumentError(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
    return precision


def thresholds_for(a: str, b: str) -> dict[str, float]:
    """Per stage kind, the looser of the two precisions' thresholds."""
    ta, tb = PRECISIONS[check_precision(a)], PRECISIONS[check_precision(b)]
    return {k: max(ta.get(k, DEFAULT_THRESHOLD), tb.get(k, DEFAULT_THRESHOLD)) for k in set(ta) | set(tb)}


def looser(a: str, b: str) -> str:
    """The looser of two precisions (the one whose table `thresholds_for` mostly takes)."""
    return min((check_precision(a), check_precision(b)), key=_ORDER.index)


def precision_of(dtypes: list[str]) -> str:
    """The precision a set of dumped arrays was stored at (dtype names): their least precise float type."""
    names = set(dtypes)
    for name, precision in (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32")):
        if name in names:
            return precision
    return "float64" if names else "float32"
