"""q4k-sign (post-mortems 001 and 000): Q4_K mins added instead of subtracted.

Gemma 3 270M's Q4_K_M file keeps `attn_output` of every layer (and `ffn_down` of 9 layers, not
layer 0) in Q4_K. With the mins added, every Q4_K weight that should be negative comes out
positive, so the first Q4_K matmul in stage order, blk.0.attn_out, is where the pass first
leaves the reference. Measured on "The color of the sky is" (7 tokens), faulty vs correct:

| stage (layer 0)  | max abs, faulty | max abs, correct | rms, faulty | rms, correct |
|------------------|-----------------|------------------|-------------|--------------|
| attn_out (Q4_K)  | 310             | 89               | 37.6        | 6.6          |
| ffn_down (Q6_K)  | 290             | 29               | 10.3        | 0.84         |
| post_ffn_norm    | 2647            | 2863             | 40.0        | 43.0         |

ffn_down itself is Q6_K here and correct: it explodes 10x because its input is already wrong,
and the sandwich norm after it puts the values back at their usual size, the masking the
post-mortem describes. The top-5 turn into のだろう, flatable, gelopen, pół, ług.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.captures import Run, TopToken
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.casebook.tools import RoundTrip, first_tensor_of_type, latin_script, weight_roundtrip
from labkit.compare import compare

PROMPT = "The color of the sky is"
Q4K_TENSOR = "blk.0.attn_output.weight"  # the first Q4_K weight in stage order

# thresholds, chosen from the measurements above with a wide margin either way
ATTN_OUT_MAX = 200.0  # faulty 310, correct 89
FFN_DOWN_MAX = 100.0  # faulty 290 (layer 0), correct at most 29 over all layers
HIDE_GROWTH = 5.0  # ffn_down rms grows 12x under the fault...
HIDE_BAND = (0.5, 2.0)  # ...while post_ffn_norm stays at 0.93x of the reference's
TOP1_PEAKED = 0.10  # the post-mortem's "top token > 10%"; correct here: 18.1% (" a")


def _max_abs(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.max(np.abs(a))) if a.size else float("nan")


def _rms(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.sqrt(np.mean(a[np.isfinite(a)] ** 2)))


@dataclass(kw_only=True)
class Q4kSignReference(Evidence):
    """The float64 reference's prompt pass and its top-10."""

    prompt: Run
    top: list[TopToken]


@dataclass(kw_only=True)
class Q4kSignEvidence(Evidence):
    """One side: the GPU's prompt pass, its top-10, and the first Q4_K weight read back through the kernel."""

    prompt: Run
    top: list[TopToken]
    roundtrip: RoundTrip  # Q4K_TENSOR through the selected Q4_K matmul


def reference(lab) -> Q4kSignReference:
    ref = lab.reference(PROMPT)
    return Q4kSignReference(side="reference", prompt=ref, top=ref.top(10))


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> Q4kSignEvidence:
    run = lab.run(PROMPT)
    rt = weight_roundtrip(lab, Q4K_TENSOR)
    return Q4kSignEvidence(side=side, variants=variants, prompt=run, top=run.top(10), roundtrip=rt)


def localize(lab, faulty: Q4kSignEvidence, ref: Q4kSignReference) -> Localization:
    cmp = compare(faulty.prompt, ref.prompt)
    return Localization(cmp.first_divergence, cmp)


def symptoms(ev: Q4kSignEvidence, ref: Q4kSignReference, faulty: Q4kSignEvidence | None = None) -> list[Check]:
    run, r = ev.prompt, ref.prompt
    attn = _max_abs(run["blk.0.attn_out"])
    down = _max_abs(run["blk.0.ffn_down"])
    growth = _rms(run["blk.0.ffn_down"]) / _rms(r["blk.0.ffn_down"])
    post = _rms(run["blk.0.post_ffn_norm"]) / _rms(r["blk.0.post_ffn_norm"])
    top5 = ev.top[:5]
    ref10 = {t.id for t in ref.top}
    strangers = [t.piece for t in top5 if t.id not in ref10]
    non_latin = [t.piece for t in top5 if not latin_script(t.piece)]
    rt = ev.roundtrip
    return [
        Check(
            "first Q4_K matmul explodes",
            f"max |blk.0.attn_out| > {ATTN_OUT_MAX:g} (correct: 89)",
            f"max |x| = {fmt(attn)}, mean {fmt(float(np.mean(run['blk.0.attn_out'])))}",
            attn > ATTN_OUT_MAX,
            attn,
        ),
        Check(
            "FFN down projection explodes at layer 0",
            f"max |blk.0.ffn_down| > {FFN_DOWN_MAX:g} (correct: 29; the post-mortem's 1B model: 3078)",
            f"max |x| = {fmt(down)}",
            down > FFN_DOWN_MAX,
            down,
        ),
        Check(
            "the post-FFN norm hides it",
            f"rms of blk.0.ffn_down > {HIDE_GROWTH:g}x the reference's while blk.0.post_ffn_norm stays within "
            f"{HIDE_BAND[0]}-{HIDE_BAND[1]}x",
            f"ffn_down {growth:.2f}x, post_ffn_norm {post:.2f}x",
            growth > HIDE_GROWTH and HIDE_BAND[0] <= post <= HIDE_BAND[1],
            {"ffn_down_growth": growth, "post_ffn_norm_ratio": post},
        ),
        Check(
            "garbage top tokens",
            "none of the top-5 is among the reference's top-10",
            "top-5 " + ", ".join(repr(t.piece) for t in top5) + f" ({len(strangers)} unknown to the reference)",
            len(strangers) == 5,
            [t.id for t in top5],
        ),
        Check(
            "non-Latin script for an English prompt",
            "at least one top-5 token has non-Latin letters",
            "non-Latin: " + (", ".join(repr(p) for p in non_latin) or "none"),
            bool(non_latin),
            len(non_latin),
        ),
        Check(
            "Q4_K weights lose their negatives on the GPU",
            f"< 5% of the first 256 columns of {Q4K_TENSOR} negative as the matmul reads them "
            f"(numpy dequant: {100 * rt.neg_frac_cpu:.1f}%)",
            rt.describe(),
            rt.neg_frac_gpu < 0.05,
            rt.neg_frac_gpu,
        ),
    ]


def checklist(ev: Q4kSignEvidence, ref: Q4kSignReference, faulty: Q4kSignEvidence | None = None) -> list[Check]:
    run = ev.prompt
    n = lab_layers(run)
    down = max(_max_abs(run[f"blk.{L}.ffn_down"]) for L in range(n))
    top = ev.top[0]
    top5 = ev.top[:5]
    cmp = compare(run, ref.prompt)
    rt = ev.roundtrip
    return [
        Check(
            "FFN down projection values are bounded",
            f"max |ffn_down| over all layers < {FFN_DOWN_MAX:g} (post-mortem: not > 1000 on its 1B model; "
            "correct here: 29)",
            f"max |ffn_down| = {fmt(down)}",
            down < FFN_DOWN_MAX,
            down,
        ),
        Check(
            "logit distribution is peaked",
            f"top token probability > {TOP1_PEAKED:.0%}",
            f"top {top.piece!r} at {top.prob:.1%}",
            top.prob > TOP1_PEAKED,
            top.prob,
        ),
        Check(
            "output tokens are Latin script for an English prompt",
            "every top-5 token is Latin script",
            "top-5 " + ", ".join(repr(t.piece) for t in top5),
            all(latin_script(t.piece) for t in top5),
        ),
        Check(
            "layer-by-layer hidden states match the reference",
            "every stage within its NMSE threshold against the float64 reference",
            f"{sum(not r.passed for r in cmp.rows)} of {len(cmp.rows)} stages fail; first {cmp.first_divergence}",
            cmp.passed,
            cmp.first_divergence,
        ),
        Check(
            "Q4_K round trip preserves negative values (000)",
            f"the GPU matmul's view of {Q4K_TENSOR} has negatives and equals numpy's dequantization",
            rt.describe(),
            rt.preserves_negatives,
            rt.max_abs_err,
        ),
    ]


def lab_layers(run) -> int:
    return sum(1 for s in run.stages if s.endswith(".resid_out"))


def root_cause_stage(lab) -> str | None:
    """Computed from the file rather than trusted: the first matmul whose weight is Q4_K."""
    hit = first_tensor_of_type(lab, "Q4_K")
    return hit[0] if hit else None


CASE = Case(
    name="q4k-sign",
    postmortem="001",
    title="Q4_K mins added instead of subtracted: layer 0 explodes, the sandwich norm hides it",
    model="gemma3-270m",
    prompt=PROMPT,
    fault={"matmul_q4_k": "mins_added"},
    fix={"matmul_q4_k": "default"},
    root_cause_stage="blk.0.attn_out",
    symptoms=symptoms,
    checklist=checklist,
    reference=reference,
    observe=observe,
    localize=localize,
    story=(
        "Gemma 3 1B on WebGPU answered 'the color of the sky is' with Telugu, Kannada and <unused> "
        "tokens. Stage statistics showed the FFN down projection of layer 0 at min -3078, but the "
        "post-FFN sandwich norm put the values back at their usual size, so nothing downstream looked "
        "extreme. Dequantization tests of q_proj and gate_proj had passed. The cause was in the Q4_K "
        "path: the per-sub-block mins were added instead of subtracted, so negative weights came out "
        "positive (post-mortem 000 later listed 'Q4_K round trip preserves negatives' as a check)."
    ),
    lesson=(
        "Look at a stage before its norm: a sandwich norm rescales an explosion back to normal size, "
        "and the damage only shows as wrong tokens. Localize against a reference stage by stage: the "
        "first failing stage is the first Q4_K matmul (blk.0.attn_out), not the FFN where the values "
        "are largest. Verify a quantized path through the real kernel (a one-hot matmul), not a "
        "separate dequantizer."
    ),
    notes=[
        "Near-uniform logits (the post-mortem's top-1 at 3%) do not reproduce on gemma3-270m: the fault "
        "gives a confident wrong token (のだろう at 59%), so 'top token > 10%' passes under the fault too; "
        "the Latin-script and reference checks are the ones that catch it here.",
        "The explosion is in the hundreds (ffn_down 290, attn_out 310), not the thousands of the 1B model.",
        "ffn_down of layer 0 is Q6_K in this file: it explodes because its input is wrong, not because its "
        "own weights are.",
    ],
)
