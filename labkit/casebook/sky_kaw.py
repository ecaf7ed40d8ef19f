"""sky-kaw (post-mortem 000): decode runs the prefill attention; the 5-value readout misleads.

The post-mortem chased a "positive bias" in the last position's hidden state, read from five
values, and fixed two real-looking attention bugs (the decode path used the prefill kernel;
a tier's workgroup count) while the garbage persisted. The lab reproduces its first bug,
`attn_scores=decode_uses_prefill`: a decode step runs the kernel written for a fresh prompt,
which assumes no cached positions, so the new token attends to position 0 only.

The prompt pass is untouched by that fault (the prefill kernel is the right one there), so
the case reads the sky prompt's prediction through the decode path as well: "The color of
the sky" is prefilled and " is" is decoded on its cache ("the sky step"). A correct engine
gives the prompt pass's last-position logits again (here bit for bit). Measured on
gemma3-270m:

| sky step             | faulty                 | fixed                  |
|----------------------|------------------------|------------------------|
| NMSE vs prompt pass  | 0.546                  | 0                      |
| " blue" rank         | 1889                   | 2 (as in the prompt pass) |
| blk.0 attention beyond position 0 (max over heads) | 0 | 0.84 |
| greedy continuation, 4 tokens | " a 20" (' ' then digits) | " a beautiful thing." (= reference) |
| logit lens: best rank of " blue" over the 18 layers | 1889 (last layer) | 2 (rank 14 already at layer 12) |

The post-mortem's misleading clues hold with and without the fault: a 5-value window of the
final hidden state that is all positive while 54% of the 640 values are negative; a max 16x
larger than |min| (massive activations, not a bias); mixed signs at every layer at position 0
and at the last position; and the tiled attention tier dispatched with the streaming workgroup
count, whose extra workgroups find no head and return: fixing the count leaves the logits
bit-identical and the garbage in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.casebook.tools import LogitLens, RoundTrip, logit_lens, sign_readout, weight_roundtrip
from labkit.compare import compare
from labkit.gpu.pass_request import PassRequest
from labkit.model.reference import KVCache

PROMPT = "The color of the sky is"
BLUE = 3730  # " blue" in Gemma 3's vocabulary (the post-mortem's tracked id too)
N_NEW = 4  # greedy tokens after the prompt (the fault departs at the second)
Q4K_TENSOR = "blk.0.attn_output.weight"

CONSISTENT_NMSE = 1e-3  # sky step vs prompt pass; measured faulty 0.546, fixed 0
BLUE_LOST_RANK = 100  # faulty 1889, fixed 2
ATTN_BEYOND_0 = 0.01  # faulty 0.0, fixed 0.84 (max over heads)
MIXED = (0.3, 0.7)  # negative fraction of a hidden state counted as "mixed signs"; measured 0.47-0.54
TIER_NMSE = 1e-8  # tiled vs unfused attention: accumulation order only


class TierLogits(NamedTuple):
    """The prompt pass's last-position logits with attn_ctx=tiled, under each attn_workgroups count."""

    streaming_count: np.ndarray  # T x heads workgroups: the post-mortem's wrong count
    default: np.ndarray  # ceil(T/8) x heads: the fixed count


@dataclass(kw_only=True)
class SkyKawReference(Evidence):
    """The float64 reference's sky step and greedy continuation."""

    sky_step: Run  # "The color of the sky" prefilled, " is" decoded on its cache
    greedy: list[int]  # the greedy token ids after the prompt
    text: str


@dataclass(kw_only=True)
class SkyKawEvidence(Evidence):
    """One side on the GPU: the prompt pass, the sky step, the greedy continuation, the logit lens of
    the sky step, the tier-dispatch logits and the first Q4_K weight read back through the kernel."""

    prompt: Run  # the prompt pass, as any engine runs it
    sky_step: Run  # the prompt's prediction through the decode path
    greedy: list[int]
    text: str
    lens: LogitLens  # each layer of the sky step through the final norm and the unembedding
    tier_logits: TierLogits
    roundtrip: RoundTrip  # Q4K_TENSOR through the selected Q4_K matmul


def _run(lab, engine: str, ids: list[int], caps: dict, n_past: int = 0, variants: dict | None = None) -> Run:
    """A Run of the case's own passes; a GPU one carries the kernels it ran with (its figures say them)."""
    return Run(lab.name, engine, list(ids), lab.stages, caps, piece=lab.piece, explain=lab.explain, n_past=n_past,
               variants=dict(variants or {}))  # fmt: skip


def reference(lab) -> SkyKawReference:
    """The reference's sky step (prefix, then " is" decoded on its cache) and greedy continuation."""
    ids = lab.prompt_ids(PROMPT, extra=N_NEW)
    eng = lab.reference_engine
    cache = KVCache()
    eng.forward(ids[:-1], cache, capture=[])
    step = _run(lab, "reference", ids[-1:], eng.forward(ids[-1:], cache), n_past=len(ids) - 1)
    out = [int(np.argmax(step.logits()))]
    while len(out) < N_NEW:
        z = eng.forward([out[-1]], cache, capture=["logits"])["logits"][-1]
        out.append(int(np.argmax(z)))
    return SkyKawReference(side="reference", sky_step=step, greedy=out, text=lab.detokenize(out))


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> SkyKawEvidence:
    ids = lab.prompt_ids(PROMPT, extra=N_NEW)
    ex = lab.executor
    # the prompt pass, as any engine runs it
    res = ex.run_pass(PassRequest(ids, last_logits_only=True), ex.new_state(len(ids)))
    prompt = _run(lab, "gpu", ids, res.captures, variants=variants)
    # the sky step: prefix prefilled, " is" decoded on its cache; then greedy decode continues
    state = ex.new_state(len(ids) + N_NEW)
    ex.run_pass(PassRequest(ids[:-1], names=(), last_logits_only=True), state)
    res = ex.run_pass(PassRequest(ids[-1:]), state)
    step = _run(lab, "gpu", ids[-1:], res.captures, n_past=len(ids) - 1, variants=variants)
    out = [int(np.argmax(step.logits()))]
    while len(out) < N_NEW:
        res = ex.run_pass(PassRequest([out[-1]], names=("logits",), last_logits_only=True), state)
        out.append(int(np.argmax(res.captures["logits"][-1])))
    return SkyKawEvidence(
        side=side,
        variants=variants,
        prompt=prompt,
        sky_step=step,
        greedy=out,
        text=lab.detokenize(out),
        lens=logit_lens(lab, step),
        tier_logits=tier_logits(lab, ids),
        roundtrip=weight_roundtrip(lab, Q4K_TENSOR),
    )


def tier_logits(lab, ids: list[int]) -> TierLogits:
    """The post-mortem's phase 2: the tiled attention tier dispatched with the streaming workgroup
    count (T x heads instead of ceil(T/8) x heads), then "fixed"; the prompt pass under both."""
    ex = lab.executor
    before = {f: lab.selected.get(f, "default") for f in ("attn_ctx", "attn_workgroups")}
    tiers = {}
    try:
        lab.use("attn_ctx", "tiled")
        for name in TierLogits._fields:  # the wrong workgroup count, then the fixed one
            lab.use("attn_workgroups", name)
            res = ex.run_pass(PassRequest(ids, names=("logits",), last_logits_only=True), ex.new_state(len(ids)))
            tiers[name] = np.asarray(res.captures["logits"][-1], dtype=np.float64)
    finally:
        for family, name in before.items():
            lab.use(family, name)
    return TierLogits(**tiers)


def localize(lab, faulty: SkyKawEvidence, ref: SkyKawReference) -> Localization:
    """Compare a decode step, not the prompt pass: the prompt pass agrees with the reference."""
    cmp = compare(faulty.sky_step, ref.sky_step)
    return Localization(cmp.first_divergence, cmp)


def garbage_winner(faulty: SkyKawEvidence, ref: SkyKawReference) -> tuple[int | None, int | None]:
    """(step, token): the first greedy token where the faulty continuation leaves the reference's."""
    for i, (a, b) in enumerate(zip(faulty.greedy, ref.greedy)):
        if a != b:
            return i, a
    return None, None


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


def _rank(z: np.ndarray, token: int) -> int:
    return int(np.sum(z > z[token]))


def symptoms(ev: SkyKawEvidence, ref: SkyKawReference, faulty: SkyKawEvidence) -> list[Check]:
    step, prompt = ev.sky_step, ev.prompt
    z = step.logits()
    nmse = _nmse(z, prompt.logits())
    blue = _rank(z, BLUE)
    probs = step["blk.0.attn_probs"]  # [heads, 1, keys]
    beyond = float(np.max(np.sum(probs[:, 0, 1:], axis=-1)))
    same = ev.greedy == ref.greedy
    lens_blue = ev.lens.ranks(BLUE)
    junk = garbage_winner(faulty, ref)[1]
    return [
        Check(
            "greedy continuation departs from the reference",
            f"the {N_NEW} greedy tokens differ from the reference's {ref.text!r}",
            f"{ev.text!r} {ev['greedy']}",
            not same,
            ev.greedy,
        ),
        Check(
            "decode disagrees with prefill",
            "logits of ' is' decoded on the cached prefix vs the prompt pass's last position: "
            f"NMSE > {CONSISTENT_NMSE:g}",
            f"NMSE {fmt(nmse)}",
            nmse > CONSISTENT_NMSE,
            nmse,
        ),
        Check(
            "' blue' is lost at the sky step",
            f"rank of ' blue' (id {BLUE}) > {BLUE_LOST_RANK} when the prediction goes through decode "
            f"(prompt pass: {_rank(prompt.logits(), BLUE)})",
            f"rank {blue}, logit {z[BLUE]:.2f}",
            blue > BLUE_LOST_RANK,
            blue,
        ),
        Check(
            "the logit lens never finds ' blue'",
            f"reading each layer of the sky step through the final norm and the unembedding, ' blue' ranks "
            f"> {BLUE_LOST_RANK} at every layer (tracked with the garbage winner)",
            f"best rank {min(lens_blue)} (layer {int(np.argmin(lens_blue))}); last layers {lens_blue[-3:]}",
            min(lens_blue) > BLUE_LOST_RANK,
            ev.lens.table([BLUE] + ([junk] if junk is not None else [])),
        ),
        Check(
            "the decoded token attends to position 0 only",
            f"blk.0.attn_probs of the decoded token: attention on positions 1.. < {ATTN_BEYOND_0:g} in every head",
            f"max over heads of the mass beyond position 0: {beyond:.3g}",
            beyond < ATTN_BEYOND_0,
            beyond,
        ),
    ]


def checklist(ev: SkyKawEvidence, ref: SkyKawReference, faulty: SkyKawEvidence) -> list[Check]:
    step = ev.sky_step
    n_layers = len(ev.lens.stages)
    last = np.asarray(step[f"blk.{n_layers - 1}.resid_out"][-1])
    neg = float(np.mean(last < 0))
    z = step.logits()
    at, junk = garbage_winner(faulty, ref)
    junk_piece = step.piece(junk) if junk is not None else None
    per_layer = [float(np.mean(np.asarray(step[f"blk.{L}.resid_out"][-1]) < 0)) for L in range(n_layers)]
    rt = ev.roundtrip
    blue_vs = (
        Check(
            "' blue' has a higher logit than the garbage token",
            f"at the sky step, logit(' blue') > logit({junk_piece!r}) (the faulty run's first wrong greedy token)",
            f"' blue' {z[BLUE]:.2f} vs {junk_piece!r} {z[junk]:.2f}",
            bool(z[BLUE] > z[junk]),
            float(z[BLUE] - z[junk]),
        )
        if junk is not None
        else Check(
            "' blue' has a higher logit than the garbage token",
            "the faulty run produced a garbage token to compare with",
            "the faulty continuation equals the reference's: no garbage token",
            False,
        )
    )
    return [
        Check(
            "hidden states at the last position have mixed signs",
            f"negative fraction of blk.{n_layers - 1}.resid_out at the sky step within {MIXED[0]}-{MIXED[1]}",
            f"{100 * neg:.1f}% negative of {last.size}",
            MIXED[0] <= neg <= MIXED[1],
            neg,
        ),
        blue_vs,
        Check(
            "the model generates a sensible continuation",
            f"greedy continuation equals the reference's {ref.text!r}",
            f"{ev.text!r}",
            ev.greedy == ref.greedy,
            ev.greedy,
        ),
        Check(
            "no positive bias accumulates through the layers",
            f"at the sky step every layer's resid_out has {MIXED[0]:.0%}-{MIXED[1]:.0%} negative values",
            f"negative fraction per layer {min(per_layer):.2f}-{max(per_layer):.2f}",
            all(MIXED[0] <= f <= MIXED[1] for f in per_layer),
            per_layer,
        ),
        Check(
            "Q4_K round trip preserves negative values",
            f"the GPU matmul's view of {Q4K_TENSOR} has negatives and equals numpy's dequantization",
            rt.describe(),
            rt.preserves_negatives,
            rt.max_abs_err,
        ),
    ]


def clues(ev: SkyKawEvidence, ref: SkyKawReference, faulty: SkyKawEvidence) -> list[Check]:
    prompt = ev.prompt
    n_layers = len(ev.lens.stages)
    final = f"blk.{n_layers - 1}.resid_out"
    v = np.asarray(prompt[final][-1], dtype=np.float64)
    sr = sign_readout(v, 5)
    w = sr.illusion_at
    shown = [round(float(x), 1) for x in v[w : w + 5]] if w is not None else []
    traj = {
        pos: [
            (prompt.stats(f"blk.{L}.resid_out", pos=pos).min, prompt.stats(f"blk.{L}.resid_out", pos=pos).max)
            for L in range(n_layers)
        ]
        for pos in (0, -1)
    }
    mixed_everywhere = all(lo < 0 < hi for pts in traj.values() for lo, hi in pts)
    wrong, right = ev.tier_logits
    tier_nmse = _nmse(wrong, right)
    tier_vs_unfused = _nmse(right, prompt.logits())
    return [
        Check(
            "5 values look 'all positive'",
            "some 5 consecutive values of the last position's final hidden state are all positive while "
            ">= 30% of the whole vector is negative",
            f"{final}[-1][{w}:{w + 5 if w is not None else ''}] = {shown}; {100 * sr.negative_frac:.1f}% of "
            f"{sr.n} negative; {len(sr.positive_windows)} such windows",
            w is not None and sr.negative_frac >= 0.3,
            {"window": w, "negative_frac": sr.negative_frac},
        ),
        Check(
            "a huge max looks like a positive bias",
            f"at the last position {final} has max > 5x |min| while its signs stay mixed ({MIXED[0]}-{MIXED[1]})",
            f"min {fmt(v.min())}, max {fmt(v.max())}, {100 * sr.negative_frac:.1f}% negative",
            v.max() > 5 * abs(v.min()) and MIXED[0] <= sr.negative_frac <= MIXED[1],
            {"min": v.min(), "max": v.max()},
        ),
        Check(
            "per-position trajectories are mixed at every layer",
            "min < 0 < max of resid_out at every layer, at position 0 and at the last position",
            f"last layer: pos 0 [{fmt(traj[0][-1][0])}, {fmt(traj[0][-1][1])}], last pos "
            f"[{fmt(traj[-1][-1][0])}, {fmt(traj[-1][-1][1])}]",
            mixed_everywhere,
            {str(k): v for k, v in traj.items()},
        ),
        Check(
            "the dispatch-tier 'fix' changes nothing",
            "prompt pass with attn_ctx=tiled under attn_workgroups=streaming_count (T x heads workgroups) and "
            "with the fixed count "
            f"(ceil(T/8) x heads): logits bit-identical, and within NMSE {TIER_NMSE:g} of the unfused stages",
            f"NMSE wrong vs fixed count {fmt(tier_nmse)}; tiled vs unfused {fmt(tier_vs_unfused)}; ' blue' rank "
            f"{_rank(wrong, BLUE)} vs {_rank(right, BLUE)}",
            tier_nmse == 0.0 and tier_vs_unfused < TIER_NMSE,
            tier_nmse,
        ),
    ]


CASE = Case(
    name="sky-kaw",
    postmortem="000",
    title="decode runs the prefill attention; the 'all positive' hidden state was a 5-value illusion",
    model="gemma3-270m",
    prompt=PROMPT,
    fault={"attn_scores": "decode_uses_prefill"},
    fix={"attn_scores": "default"},
    root_cause_stage="blk.0.attn_scores",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    story=(
        "Gemma 3 1B answered 'The color of the sky is' with 'Kaw'. Five values of the last position's "
        "final hidden state were all positive, so the team chased a 'positive bias'. They found and "
        "fixed a real bug (decode always ran the prefill attention variant) and a tier's workgroup "
        "count, forced streaming attention, tried the chat template: the garbage persisted each time. "
        "Reading min/max per layer at the last position finally showed mixed signs everywhere: the "
        "'bias' was an artifact of reading 5 values. The post-mortem ends unsolved, recommending a "
        "layer-by-layer comparison against a reference."
    ),
    lesson=(
        "Read whole distributions, not 5 values: a window of positives sits inside a vector that is "
        "54% negative. A change that leaves the numbers identical is not a fix. The prompt pass and "
        "the decode path are different code: compare a decode step against the reference with the "
        "same KV cache, and the first divergence names the stage (blk.0.attn_scores). Most of the "
        "post-mortem's checklist tests its disproved hypothesis, so it passes under the fault too: "
        "only the token-level items catch it."
    ),
    notes=[
        "The prompt pass is right under this fault (the prefill kernel is correct for a fresh prompt), so "
        "the wrong prediction appears in decode: the lab reads the sky prompt's prediction through the "
        "decode path (prefix prefilled, ' is' decoded), where ' blue' drops from rank 2 to 1889.",
        "The greedy garbage is ' a 20...' (a lone space, then digits) rather than 'Kaw': what wins depends on "
        "the model.",
        "Checklist items 1, 4 and 5 (mixed signs, no bias, Q4_K negatives) pass under this fault: they test "
        "the post-mortem's disproved hypotheses.",
    ],
)
