"""rope-style (post-mortem 000, hypothesis 3): a neox-rope model run with normal (interleaved) rope.

Post-mortem 000 ranked "RoPE or position encoding bug: position-dependent errors" among its
hypotheses and puzzled over why position 0 looked different from position 6. This case shows
what a rope bug really looks like. Gemma 3 rotates neox pairs (i, i + d/2); the faulty variant
`rope=normal_pairs` rotates (2i, 2i + 1), the llama convention. Position 0 rotates by angle 0,
so it is exact whatever the pairing; every later position is wrong. The damage is quiet:
measured on "The color of the sky is" (gemma3-270m), the top-3 stay " a", " the", " blue", and
the greedy continuation only parts from the reference at its third token.

| | faulty | fixed |
|---|---|---|
| blk.0.q_rope NMSE, position 0 / last | 4e-14 / 0.57 | ~1e-14 / ~1e-14 |
| logits NMSE, position 0 / 1 / last | 2e-13 / 5e-5 / 0.071 | ~1e-13 each |
| top-3 | " a", " the", " blue" | " a", " the", " blue" |
| greedy, 4 tokens | " a beautiful, the" | " a beautiful thing." (= reference) |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.captures import Run, TopToken
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.casebook.tools import GreedyReference, greedy_reference
from labkit.compare import compare

PROMPT = "The color of the sky is"
BLUE = 3730
N_NEW = 4
EXACT = 1e-10  # position 0: a rotation by 0 leaves q unchanged
WRONG_Q = 1e-2  # q_rope at the last position: faulty 0.57
WRONG_LOGITS = 1e-2  # logits at the last position: faulty 0.071
STAGE_NMSE = 1e-5  # the rope stages' own NMSE bound (labkit.compare)


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-300))


def per_position(run: Run, ref: Run, stage: str) -> list[float]:
    """NMSE of one stage at each position (rows of [positions, ...] captures)."""
    return [_nmse(run[stage][i], ref[stage][i]) for i in range(len(run.tokens))]


@dataclass(kw_only=True)
class RopeStyleEvidence(Evidence):
    """One side: the prompt pass, its top tokens and the GPU's greedy continuation."""

    prompt: Run  # every stage of the prompt pass
    greedy: list[int]  # lab.generate's greedy token ids
    text: str
    top: list[TopToken]  # the prompt pass's top-5


def reference(lab) -> GreedyReference:
    return greedy_reference(lab, PROMPT, N_NEW)


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> RopeStyleEvidence:
    run = lab.run(PROMPT)
    gen = lab.generate(PROMPT, N_NEW)
    return RopeStyleEvidence(side=side, variants=variants, prompt=run, greedy=gen.ids, text=gen.text, top=run.top(5))


def localize(lab, faulty: RopeStyleEvidence, ref: GreedyReference) -> Localization:
    cmp = compare(faulty.prompt, ref.prompt)
    return Localization(cmp.first_divergence, cmp)


def symptoms(ev: RopeStyleEvidence, ref: GreedyReference, faulty: RopeStyleEvidence) -> list[Check]:
    run, r = ev.prompt, ref.prompt
    q = per_position(run, r, "blk.0.q_rope")
    z = per_position(run, r, "logits")
    return [
        Check(
            "position 0 is exact, later positions are not",
            f"blk.0.q_rope NMSE at position 0 < {EXACT:g} and at the last position > {WRONG_Q:g}",
            "per position " + ", ".join(fmt(x) for x in q),
            q[0] < EXACT and q[-1] > WRONG_Q,
            q,
        ),
        Check(
            "the error grows with position",
            f"logits NMSE at the last position > {WRONG_LOGITS:g}, and at least 100x position 1's",
            "per position " + ", ".join(fmt(x) for x in z),
            z[-1] > WRONG_LOGITS and z[-1] > 100 * max(z[1], 1e-300),
            z,
        ),
        Check(
            "the continuation departs from the reference",
            f"the {N_NEW} greedy tokens differ from the reference's {ref.text!r}",
            f"{ev.text!r}",
            ev.greedy != ref.greedy,
            ev.greedy,
        ),
    ]


def checklist(ev: RopeStyleEvidence, ref: GreedyReference, faulty: RopeStyleEvidence) -> list[Check]:
    run, r = ev.prompt, ref.prompt
    cmp = compare(run, r)
    n_layers = sum(1 for s in run.stages if s.endswith(".resid_out"))
    worst = max(max(per_position(run, r, f"blk.{L}.{k}")) for L in range(n_layers) for k in ("q_rope", "k_rope"))
    scores = [cmp.row(f"blk.{L}.attn_scores") for L in range(n_layers)]
    return [
        Check(
            "layer-by-layer hidden states match the reference",
            "every stage within its NMSE threshold against the float64 reference (000's next step 4)",
            f"{sum(not x.passed for x in cmp.rows)} of {len(cmp.rows)} stages fail; first {cmp.first_divergence}",
            cmp.passed,
            cmp.first_divergence,
        ),
        Check(
            "rotary embedding right at every position",
            f"q_rope and k_rope NMSE < {STAGE_NMSE:g} at every position of every layer",
            f"worst {fmt(worst)}",
            worst < STAGE_NMSE,
            worst,
        ),
        Check(
            "attention scores match the reference",
            "every layer's Q.K^T scores within their NMSE bound (000's next step 'compare attention scores')",
            f"{sum(not x.passed for x in scores)} of {n_layers} layers fail",
            all(x.passed for x in scores),
        ),
        Check(
            "the model generates the reference's continuation",
            f"greedy tokens equal the reference's {ref.text!r}",
            f"{ev.text!r}",
            ev.greedy == ref.greedy,
            ev.greedy,
        ),
    ]


def clues(ev: RopeStyleEvidence, ref: GreedyReference, faulty: RopeStyleEvidence) -> list[Check]:
    top = ev.top
    return [
        Check(
            "the output still looks right",
            "top-1 is the reference's and ' blue' is in the top-3",
            "top-3 " + ", ".join(f"{t.piece!r} {t.prob:.1%}" for t in top[:3]),
            top[0].id == int(np.argmax(ref.prompt.logits())) and BLUE in [t.id for t in top[:3]],
        ),
    ]


CASE = Case(
    name="rope-style",
    postmortem="000",
    title="neox rope run as normal rope: position 0 exact, every later position quietly wrong",
    model="gemma3-270m",
    prompt=PROMPT,
    fault={"rope": "normal_pairs"},
    fix={"rope": "default"},
    root_cause_stage="blk.0.q_rope",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    story=(
        "Post-mortem 000 listed a RoPE or position-encoding bug among its hypotheses ('position-"
        "dependent errors') after noticing that position 0 looked healthy while the last position did "
        "not, and recommended comparing attention scores against a reference. Rotary embeddings come "
        "in two pairings, neox (i, i + d/2: Gemma, Qwen) and normal (2i, 2i + 1: llama as its GGUF "
        "files store it, because llama.cpp's converter permutes q and k; Hugging Face's llama rotates "
        "halves); running one model with the other's is a classic porting bug."
    ),
    lesson=(
        "Compare per position, not per tensor: a rope bug leaves position 0 exact (angle 0) and grows "
        "with position, so a check on the first token or on the BOS passes. Plausible output is not "
        "evidence: the top-3 survive this bug, the third generated token does not."
    ),
    notes=[
        "Not one of the five post-mortems' root causes: a hypothesis post-mortem 000 listed, run as a case.",
    ],
)
