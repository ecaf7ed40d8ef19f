"""moe-router: a mixture of experts whose router forgets to renormalize the selected weights.

Not from the five post-mortems: the router bugs of issue 24, on a model of the family they live
in. qwen3moe (like Mixtral) takes the softmax over all experts, keeps the k best, and divides
their probabilities by their sum (`norm_topk_prob`); the faulty variant `moe_router=no_renormalize`
skips the division, as pytorch/torchtitan#1448 did for DeepSeek-V3 and sglang#35160's other arm
did. The right experts are chosen, so every routing check that looks at ids passes; only the
weights are wrong, each token's k weights summing to the probability mass of its k experts
(0.4 to 0.9 with 4 of 16 here), so every layer's mixture output shrinks and the residual stream
drifts. Run on `tiny-qwen3moe` (random weights, written by labkit), against the float64 reference
and llama.cpp's own tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.casebook.tools import oracle_or_none
from labkit.compare import compare

IDS = [1, 37, 211, 5, 98, 410, 76, 12, 333, 150, 64, 7]  # placeholder tokens of the tiny vocabulary
PROMPT = "token ids " + " ".join(map(str, IDS))
SUM_TOL = 1e-5  # |Σ w - 1| of renormalized f32 weights: ~1e-7
WRONG_SUM = 1e-2  # the fault's sums: 0.2-0.7
SHRUNK = 0.9  # layer 0's mixture output norm, faulty / reference: the sum of the k probabilities


@dataclass(kw_only=True)
class MoeReference(Evidence):
    """The float64 reference's pass and llama.cpp's own tensors for the same tokens (None without
    llama-cpp-python)."""

    prompt: Run
    oracle: Run | None


@dataclass(kw_only=True)
class MoeRouterEvidence(Evidence):
    """One side: the GPU pass and each layer's sums of the selected experts' weights."""

    prompt: Run
    weight_sums: np.ndarray  # [layers, T]: Σ over the k selected of ffn_expert_weights


def n_layers(run: Run) -> int:
    return sum(1 for s in run.stages if s.endswith(".ffn_topk"))


def reference(lab) -> MoeReference:
    return MoeReference(side="reference", prompt=lab.reference(IDS), oracle=oracle_or_none(lab, IDS))


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> MoeRouterEvidence:
    run = lab.run(IDS)
    sums = np.stack([run[f"blk.{L}.ffn_expert_weights"].sum(axis=1) for L in range(n_layers(run))])
    return MoeRouterEvidence(side=side, variants=variants, prompt=run, weight_sums=sums)


def localize(lab, faulty: MoeRouterEvidence, ref: MoeReference) -> Localization:
    cmp = compare(faulty.prompt, ref.prompt)
    return Localization(cmp.first_divergence, cmp)


def _norm_ratio(run: Run, ref: Run, stage: str) -> float:
    return float(np.linalg.norm(run[stage]) / np.linalg.norm(ref[stage]))


def symptoms(ev: MoeRouterEvidence, ref: MoeReference, faulty: MoeRouterEvidence) -> list[Check]:
    off = float(np.max(np.abs(ev.weight_sums - 1.0)))
    ratio = _norm_ratio(ev.prompt, ref.prompt, "blk.0.ffn_moe_out")
    z = compare(ev.prompt, ref.prompt).row("logits")
    return [
        Check("the selected experts' weights do not sum to 1",
              f"max over layers and tokens of |Σ_k w - 1| > {WRONG_SUM:g}",
              f"{fmt(off)} (sums from {ev.weight_sums.min():.3f} to {ev.weight_sums.max():.3f})", off > WRONG_SUM, off),
        Check("the mixture's output shrinks", f"‖blk.0.ffn_moe_out‖ faulty / reference < {SHRUNK:g}",
              f"{ratio:.3f}", ratio < SHRUNK, ratio),
        Check("the logits part from the reference", "logits outside their NMSE bound against the float64 reference",
              f"nmse {fmt(z.nmse)} (bound {z.threshold:.0e})", not z.passed, z.nmse),
    ]  # fmt: skip


def checklist(ev: MoeRouterEvidence, ref: MoeReference, faulty: MoeRouterEvidence) -> list[Check]:
    cmp = compare(ev.prompt, ref.prompt)
    off = float(np.max(np.abs(ev.weight_sums - 1.0)))
    out = [
        Check("every stage matches the reference", "every stage within its NMSE bound, ids exactly",
              f"{sum(not r.passed for r in cmp.rows)} of {len(cmp.rows)} stages fail; first {cmp.first_divergence}",
              cmp.passed, cmp.first_divergence),
        Check("renormalized weights", f"|Σ_k w - 1| < {SUM_TOL:g} for every token of every layer", fmt(off),
              off < SUM_TOL, off),
    ]  # fmt: skip
    if ref.oracle is None:
        return out
    orc = compare(ev.prompt, ref.oracle)
    topk = [r for r in orc.rows if r.stage.endswith(".ffn_topk")]
    ties = "; ".join(f"{r.stage}: {r.reason}" for r in topk if r.reason and r.passed)
    return out + [
        Check("the experts are llama.cpp's", "ffn_topk equals llama.cpp's ffn_moe_topk on every token of every layer, "
              "but where the two engines' probabilities tie within their own disagreement",
              ("equal" + (f" ({ties})" if ties else "")) if all(r.passed for r in topk)
              else "; ".join(f"{r.stage}: {r.reason}" for r in topk if not r.passed), all(r.passed for r in topk)),
        Check("every stage matches llama.cpp", "every stage within its bound against llama.cpp's own tensors",
              f"{sum(not r.passed for r in orc.rows)} of {len(orc.rows)} stages fail; first {orc.first_divergence}",
              orc.passed, orc.first_divergence),
    ]  # fmt: skip


def clues(ev: MoeRouterEvidence, ref: MoeReference, faulty: MoeRouterEvidence) -> list[Check]:
    same = np.array_equal(ev.prompt["blk.0.ffn_topk"], ref.prompt["blk.0.ffn_topk"])
    return [
        Check("the router picks the right experts", "layer 0's ffn_topk equals the reference's on every token",
              "equal" if same else "different", same),
    ]  # fmt: skip


CASE = Case(
    name="moe-router",
    postmortem="",
    title="MoE router without renormalization: the right experts, weights that sum to less than 1",
    model="tiny-qwen3moe",
    prompt=PROMPT,
    fault={"moe_router": "no_renormalize"},
    fix={"moe_router": "default"},
    root_cause_stage="blk.0.ffn_expert_weights",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    story=(
        "A mixture of experts sends each token to k of its experts and adds their outputs, each times a "
        "router weight. Models differ in how they make those weights: Mixtral and Qwen3-MoE take the softmax "
        "over all experts and renormalize the k selected probabilities (norm_topk_prob); OLMoE does not; "
        "gpt-oss takes the softmax over the k selected logits. Ports get this wrong silently: "
        "pytorch/torchtitan#1448 ran DeepSeek-V3 checkpoints without norm_topk_prob, and sglang#35160 found a "
        "router arm that returned raw logits as weights. The text stays plausible."
    ),
    lesson=(
        "Check the router's weights, not only its choices: a fault in the weights keeps every expert id right, "
        "so an ids-only check passes, while every mixture output is scaled by the k experts' probability mass. "
        "Compare ffn_expert_weights stage by stage, and check that they sum to 1 where the model renormalizes."
    ),
    notes=[
        "Not from the five post-mortems: issue 24's router faults, run as a case on labkit's own tiny qwen3moe "
        "(no MoE model ships on PyPI). The other router faults are variants of the same family: "
        "expert_index_off_by_one shows at ffn_topk; softmax_after_topk is harmless here, as the model "
        "renormalizes.",
    ],
)
