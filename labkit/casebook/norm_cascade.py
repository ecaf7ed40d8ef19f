"""norm-cascade (post-mortem 003): tiny RMSNorm output, huge Q/K/V, scores in the millions, zero logits.

The post-mortem (BitNet, I2_S weights) saw, at layer 0: RMSNorm output with an L2 norm of
0.018, Q/K/V with means of 150-235 and stds near 1000, pre-mask scores with a std of 5.9e6,
then an infinite hidden-state norm after the FFN and logits of exactly zero. Its chain says
"small RMSNorm x large weights = huge Q/K/V", and it suspects the norm weight's scale
(hypothesis A), the I2_S scale clamp `s.clamp(1e-6, 1e6)` (B) and a misplaced eps (C).

What the shipped faults do on SmolLM2-135M (measured, "The color of the sky is"):
- `rmsnorm=scale_clamp` (norm weights at a 1.688e-4 block scale) alone makes everything
  tiny: Q/K/V around 2e-4, scores 2e-7, last-position logits with a std of 0.003. Tiny norm output alone
  cannot produce huge Q/K/V: the chain's step 2 needs weights at a huge scale as well.
- `rmsnorm=eps_outside` (hypothesis C) is invisible: every stage stays within its NMSE bound.
- `softmax=no_max_sub` only matters once scores pass ~88; the post-mortem's softmax did
  subtract the max ("max-subtraction applied, but softmax still degenerates").

So this case adds hypothesis B as a variant it registers itself, `matmul_q4_1=scale_clamp_swapped`:
the block-scale clamp written with its bounds swapped, `max(min(d, 1e-6), 1e6)`, which turns
every Q4_1 block scale into 1e6. Together with the tiny norm the numbers land where the
post-mortem's did (faulty vs fixed, layer 0):

| stage | faulty | fixed |
|---|---|---|
| attn_norm rms per element | 8.1e-6 | 0.048 |
| q mean / std | 1925 / 2028 | -0.05 / 1.16 |
| max abs q, k, v | 8798 | 10.4 |
| scores (unmasked) max | 1.3e8 | 8.1 |
| attn_probs rows one-hot | all | none |
| resid_out (f32) L2 norm | inf (values ~7e19, their squares overflow) | 30-62 |
| blk.1.attn_norm | exactly 0 | normal |
| logits std, last position | 0 | 3.69 |

The "inf through the layers" of the post-mortem is the f32 L2 norm it printed: the values
stay finite (about 7e19), but their squares overflow, so every later RMSNorm divides by inf
and returns zeros, and the logits come out as exact zeros. Its "scores post-mask: mean=-inf
std=NaN" is not a fault at all: the causal mask's -inf entries give that in a correct pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.casebook.tools import register_reader_fault
from labkit.compare import Comparison, compare

PROMPT = "The color of the sky is"
CLAMP_VARIANT = "scale_clamp_swapped"
F32_MAX = float(np.finfo(np.float32).max)

# symptom thresholds (faulty / fixed measured in the module docstring)
TINY_NORM_RMS = 1e-3
HUGE_QKV = 1000.0
HUGE_SCORES = 1e6
ONE_HOT = 0.999
ZERO_LOGITS_STD = 1e-6

# the post-mortem's acceptance criteria, adapted to SmolLM2 (d_model 576, small norm weights)
NORM_RMS_RANGE = (0.01, 1.0)  # post-mortem: L2 5-15 at d=2560 (rms 0.1-0.3); here rms 0.048, L2 1.15
Q_MEAN_MAX, Q_STD_RANGE = 1.0, (0.3, 5.0)  # post-mortem: mean O(-1..1), std O(1..3); here -0.05, 1.16
SCORE_MEAN_MAX, SCORE_STD_MAX = 10.0, 20.0  # pre-mask; here 2.9, 1.7
SCORE_RANGE = (-50.0, 20.0)  # post-mask finite range; post-mortem O(-50..0) to O(0..10); here -0.4..8.1
RESID_L2_MAX = 1000.0  # blk.0.resid_out L2 per position; post-mortem "O(1 to 10)"; here 30-62
LOGIT_MEAN_MAX, LOGIT_STD_RANGE = 5.0, (1.0, 100.0)  # post-mortem O(-5..5) / O(10..100); here 0.95 / 3.69


def register_clamp_variant() -> None:
    """Hypothesis B as a matmul variant: Q4_1 block scales through a clamp with swapped bounds."""
    register_reader_fault(
        "matmul_q4_1",
        CLAMP_VARIANT,
        "return Parts4(bytes4(nib), read_f16(bb),",
        "return Parts4(bytes4(nib), max(min(read_f16(bb), 1e-6), 1e6),  // clamp(d, 1e-6, 1e6), bounds swapped\n",
        "Q4_1 block scale through an I2_S-style clamp(1e-6, 1e6) with its bounds swapped: every "
        "scale reads 1e6 (003, hypothesis B; registered by the norm-cascade case)",
    )


def _f32_l2(a: np.ndarray) -> np.ndarray:
    """Per-position L2 norm computed in float32, as an f32 engine's debug print would."""
    x = np.asarray(a, dtype=np.float32)
    with np.errstate(over="ignore"):
        return np.sqrt(np.sum(x * x, axis=-1, dtype=np.float32))


def _unmasked(scores: np.ndarray) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    return s[np.isfinite(s)]


@dataclass(kw_only=True)
class NormCascadeReference(Evidence):
    """The float64 reference's prompt pass, and hypothesis C (eps outside the sqrt) tried against it."""

    prompt: Run
    eps_outside: Comparison  # the GPU pass under rmsnorm=eps_outside alone, against the reference


@dataclass(kw_only=True)
class NormCascadeEvidence(Evidence):
    """One side: the GPU's prompt pass."""

    prompt: Run


def reference(lab) -> NormCascadeReference:
    ref = lab.reference(PROMPT)
    # hypothesis C on its own, once: eps added outside the square root
    lab.use("rmsnorm", "eps_outside")
    try:
        eps = compare(lab.run(PROMPT), ref)
    finally:
        lab.use("rmsnorm", "default")
    return NormCascadeReference(side="reference", prompt=ref, eps_outside=eps)


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> NormCascadeEvidence:
    return NormCascadeEvidence(side=side, variants=variants, prompt=lab.run(PROMPT))


def localize(lab, faulty: NormCascadeEvidence, ref: NormCascadeReference) -> Localization:
    cmp = compare(faulty.prompt, ref.prompt)
    return Localization(cmp.first_divergence, cmp)


def _qkv_max(run) -> float:
    return max(float(np.max(np.abs(run[f"blk.0.{k}"]))) for k in ("q", "k", "v"))


def symptoms(ev: NormCascadeEvidence, ref: NormCascadeReference, faulty: NormCascadeEvidence) -> list[Check]:
    run = ev.prompt
    norm_rms = run.stats("blk.0.attn_norm").rms
    q = run.stats("blk.0.q")
    qkv = _qkv_max(run)
    sc = _unmasked(run["blk.0.attn_scores"])
    smax = float(np.max(np.abs(sc)))
    probs = np.asarray(run["blk.0.attn_probs"], dtype=np.float64)[:, 1:, :]  # rows with >= 2 keys
    one_hot = float(np.mean(np.nanmax(probs, axis=-1) > ONE_HOT)) if np.isfinite(probs).all() else float("nan")
    l2 = _f32_l2(run["blk.0.resid_out"])
    nxt = np.asarray(run["blk.1.attn_norm"])
    z = run.logits()
    return [
        Check(
            "tiny RMSNorm output",
            f"blk.0.attn_norm rms per element < {TINY_NORM_RMS:g} (correct: 0.048; post-mortem: 3.6e-4)",
            f"rms {fmt(norm_rms)}, L2 per position {fmt(norm_rms * np.sqrt(run['blk.0.attn_norm'].shape[-1]))}",
            norm_rms < TINY_NORM_RMS,
            norm_rms,
        ),
        Check(
            "huge Q/K/V",
            f"max |x| over blk.0.q, k, v > {HUGE_QKV:g} (correct: 10; post-mortem: means 150-235, stds ~1000)",
            f"max {fmt(qkv)}; q mean {fmt(q.mean)} std {fmt(q.std)}",
            qkv > HUGE_QKV,
            qkv,
        ),
        Check(
            "scores in the millions",
            f"max |score| over blk.0.attn_scores' unmasked entries > {HUGE_SCORES:g} (correct: 8.1)",
            f"max {fmt(smax)}, mean {fmt(float(sc.mean()))}, std {fmt(float(sc.std()))}",
            smax > HUGE_SCORES,
            smax,
        ),
        Check(
            "softmax degenerates",
            f"every blk.0.attn_probs row with >= 2 keys has a max > {ONE_HOT} (one-hot)",
            f"{100 * one_hot:.0f}% of rows one-hot",
            one_hot == 1.0,
            one_hot,
        ),
        Check(
            "inf through the layers",
            "the f32 L2 norm of blk.0.resid_out overflows to inf, and blk.1.attn_norm is exactly 0 everywhere",
            f"L2 per position {[fmt(float(x)) for x in l2]}; max |blk.0.resid_out| "
            f"{fmt(float(np.max(np.abs(run['blk.0.resid_out']))))}; blk.1.attn_norm max |x| "
            f"{fmt(float(np.max(np.abs(nxt))))}",
            bool(np.all(np.isinf(l2))) and bool(np.all(nxt == 0)),
            [float(x) for x in l2],
        ),
        Check(
            "zero logits",
            f"std of the last position's logits < {ZERO_LOGITS_STD:g}",
            f"mean {fmt(float(z.mean()))}, std {fmt(float(z.std()))}",
            float(z.std()) < ZERO_LOGITS_STD,
            float(z.std()),
        ),
    ]


def checklist(ev: NormCascadeEvidence, ref: NormCascadeReference, faulty: NormCascadeEvidence) -> list[Check]:
    run = ev.prompt
    norm = run.stats("blk.0.attn_norm")
    q = run.stats("blk.0.q")
    sc = _unmasked(run["blk.0.attn_scores"])
    n_layers = sum(1 for s in run.stages if s.endswith(".resid_out"))
    bad = {
        s: int(np.sum(~np.isfinite(run[s])))
        for s in run.stages
        if not s.endswith("attn_scores") and s in run.captures and not np.isfinite(run[s]).all()
    }
    l2 = np.stack([_f32_l2(run[f"blk.{L}.resid_out"]) for L in range(n_layers)])
    l2_0 = l2[0]
    z = run.logits()
    return [
        Check(
            "RMSNorm (attn, layer 0) output in range",
            f"rms per element within {NORM_RMS_RANGE[0]}-{NORM_RMS_RANGE[1]} (post-mortem: L2 5-15 at d=2560, "
            "i.e. rms 0.1-0.3; SmolLM2's norm weights are smaller)",
            f"rms {fmt(norm.rms)}",
            NORM_RMS_RANGE[0] <= norm.rms <= NORM_RMS_RANGE[1],
            norm.rms,
        ),
        Check(
            "Q: mean O(+-1), std O(1)",
            f"|mean(blk.0.q)| <= {Q_MEAN_MAX:g} and std within {Q_STD_RANGE[0]}-{Q_STD_RANGE[1]}",
            f"mean {fmt(q.mean)}, std {fmt(q.std)}",
            abs(q.mean) <= Q_MEAN_MAX and Q_STD_RANGE[0] <= q.std <= Q_STD_RANGE[1],
            {"mean": q.mean, "std": q.std},
        ),
        Check(
            "scores pre-mask: mean O(+-10), std O(1-20)",
            f"unmasked blk.0.attn_scores: |mean| <= {SCORE_MEAN_MAX:g}, std <= {SCORE_STD_MAX:g}",
            f"mean {fmt(float(sc.mean()))}, std {fmt(float(sc.std()))}",
            abs(float(sc.mean())) <= SCORE_MEAN_MAX and float(sc.std()) <= SCORE_STD_MAX,
            {"mean": float(sc.mean()), "std": float(sc.std())},
        ),
        Check(
            "scores post-mask in O(-50..10)",
            f"finite blk.0.attn_scores within [{SCORE_RANGE[0]:g}, {SCORE_RANGE[1]:g}]",
            f"[{fmt(float(sc.min()))}, {fmt(float(sc.max()))}]",
            SCORE_RANGE[0] <= float(sc.min()) and float(sc.max()) <= SCORE_RANGE[1],
            [float(sc.min()), float(sc.max())],
        ),
        Check(
            "post-FFN hidden state not inf",
            f"no NaN/inf in any stage (masked scores aside), every layer's f32 L2 norm finite, "
            f"blk.0.resid_out L2 <= {RESID_L2_MAX:g} per position",
            f"non-finite stages: {len(bad)}; inf L2 norms: {int(np.sum(np.isinf(l2)))}; blk.0 L2 "
            f"{fmt(float(np.max(l2_0)))}",
            not bad and bool(np.all(np.isfinite(l2))) and float(np.max(l2_0)) <= RESID_L2_MAX,
            float(np.max(l2_0)),
        ),
        Check(
            "logits: mean O(+-5), std O(1-100)",
            f"last position: |mean| <= {LOGIT_MEAN_MAX:g}, std within {LOGIT_STD_RANGE[0]:g}-{LOGIT_STD_RANGE[1]:g} "
            "(post-mortem: std O(10-100) at its vocabulary)",
            f"mean {fmt(float(z.mean()))}, std {fmt(float(z.std()))}",
            abs(float(z.mean())) <= LOGIT_MEAN_MAX and LOGIT_STD_RANGE[0] <= float(z.std()) <= LOGIT_STD_RANGE[1],
            {"mean": float(z.mean()), "std": float(z.std())},
        ),
    ]


def clues(ev: NormCascadeEvidence, ref: NormCascadeReference, faulty: NormCascadeEvidence) -> list[Check]:
    sc = np.asarray(ev.prompt["blk.0.attn_scores"], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        mean, std = float(np.mean(sc)), float(np.std(sc))
    n_inf = int(np.sum(np.isinf(sc)))
    eps = ref.eps_outside
    worst = max(eps.rows, key=lambda r: r.nmse / r.threshold)
    return [
        Check(
            "'scores post-mask: mean=-inf std=NaN'",
            "naive stats over the masked scores give mean -inf and std NaN in any pass: the causal mask's -inf",
            f"mean {mean}, std {std}, {n_inf} -inf entries (the masked upper triangle)",
            mean == -np.inf and np.isnan(std) and n_inf > 0,
            n_inf,
        ),
        Check(
            "hypothesis C (eps outside the sqrt) changes nothing measurable",
            "rmsnorm=eps_outside alone: every stage within its NMSE bound against the reference",
            f"first divergence {eps.first_divergence}; closest to its bound: {worst.stage} nmse "
            f"{worst.nmse:.2e} (bound {worst.threshold:.0e})",
            eps.passed,
            eps.first_divergence,
        ),
    ]


CASE = Case(
    name="norm-cascade",
    postmortem="003",
    title="norm weights at a wrong scale and block scales through a swapped clamp: tiny norm, huge Q/K/V, zero logits",
    model="smollm2-135m",
    prompt=PROMPT,
    fault={"rmsnorm": "scale_clamp", "matmul_q4_1": CLAMP_VARIANT},
    fix={"rmsnorm": "default", "matmul_q4_1": "default"},
    root_cause_stage="blk.0.attn_norm",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    setup=register_clamp_variant,
    story=(
        "BitNet.rs produced non-grammatical text. A diagnostic run printed, at layer 0: an RMSNorm "
        "output with L2 norm 0.018, Q/K/V with means of 150-235, pre-mask scores with a std of "
        "5.9 million, 'scores post-mask: mean=-inf std=NaN', then [norm] post-ffn: inf, and tied "
        "logits of mean/std 0.0000/0.0000. The report lists three hypotheses (the norm weight's "
        "scale, the I2_S scale clamp, a misplaced eps) and acceptance criteria for a fix."
    ),
    lesson=(
        "A root-cause chain has to multiply out: a tiny norm output times normal weights is tiny, "
        "so 'huge Q/K/V' needs a second fault at the weights' scale. Test each hypothesis as a "
        "variant: the misplaced eps changes nothing, the swapped clamp explains the magnitudes. "
        "'inf' in an f32 norm print can come from finite values whose squares overflow; and a "
        "masked score matrix always has mean -inf. The first divergent stage is the first norm."
    ),
    notes=[
        "The post-mortem's faults are in I2_S weights; SmolLM2 has Q4_1 weights, so hypothesis B is "
        "reproduced as a Q4_1 variant (scale_clamp_swapped) that this case registers itself.",
        "With the shipped faults alone (rmsnorm=scale_clamp, softmax=no_max_sub) the chain does not "
        "happen: everything gets tiny, scores never reach the ~88 where no_max_sub overflows, and "
        "there is no NaN. softmax=no_max_sub under this case's fault would turn the one-hot rows into "
        "NaN and the logits into NaN rather than 0 (see the notebook); the post-mortem's softmax did "
        "subtract the max, so it is not part of the fault.",
        "'NaN after the mask' is reproduced as what it was in the post-mortem's print: the std of a "
        "matrix holding -inf (a clue, present in the correct pass too).",
    ],
)
