"""batch-crosstalk: requests served together read each other's KV cache.

Not from the five post-mortems: the serving-paths issue's batch fault, on a real model. A server packs
several requests into one pass; what mixes a request's tokens (its positions, its KV cache, its
attention) must keep the requests apart. Under `kv_sequence=previous_sequence` each request after the
first attends to the keys and values of the request packed before it, as LMCache/LMCache#4385 (returning
sessions answered from other requests' KV cache) and waybarrios/vllm-mlx#775 reported. Every test that
runs one request at a time passes: the prompt alone, its decode step and its greedy text are right. Only
a batch shows it, and only for the requests after the first.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.captures import Run
from labkit.casebook.base import Case, Check, Evidence, Localization, fmt
from labkit.compare import compare

PROMPT = "The color of the sky is"
# the requests served with the prompt, packed in this order: the prompt first reads its own cache
REQUESTS = [PROMPT, "Hello there, how are you doing today?", "Once upon a time, in a small village"]
WRONG_SCORES = 1e-2  # the second request's blk.0.attn_scores against its reference: faulty 0.36


@dataclass(kw_only=True)
class BatchReference(Evidence):
    """Each request alone on the float64 reference, and llama.cpp computing the same batch (None
    without llama-cpp-python)."""

    alone: list[Run]
    llamacpp: list[Run] | None


@dataclass(kw_only=True)
class BatchEvidence(Evidence):
    """One side: the prompt served alone, and every request served in one batch."""

    alone: Run
    batch: list[Run]


def reference(lab) -> BatchReference:
    from labkit.errors import OracleUnavailableError

    try:
        theirs = lab.run_batch(REQUESTS, engine="llamacpp")
    except OracleUnavailableError:
        theirs = None
    return BatchReference(side="reference", alone=[lab.reference(r) for r in REQUESTS], llamacpp=theirs)


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> BatchEvidence:
    return BatchEvidence(side=side, variants=variants, alone=lab.run(PROMPT), batch=lab.run_batch(REQUESTS))


def localize(lab, faulty: BatchEvidence, ref: BatchReference) -> Localization:
    """The first request whose batch run parts from its own reference, at its first divergence."""
    for run, alone in zip(faulty.batch, ref.alone):
        cmp = compare(run, alone)
        if not cmp.passed:
            return Localization(cmp.first_divergence, cmp)
    return Localization(None, compare(faulty.batch[-1], ref.alone[-1]))


def _logits(run: Run, alone: Run):
    return compare(run, alone).row("logits")


def symptoms(ev: BatchEvidence, ref: BatchReference, faulty: BatchEvidence) -> list[Check]:
    later = [_logits(r, a) for r, a in zip(ev.batch[1:], ref.alone[1:])]
    mine, theirs = ev.batch[1].top(1)[0], ref.alone[1].top(1)[0]
    scores = compare(ev.batch[1], ref.alone[1]).row("blk.0.attn_scores")
    return [
        Check("the requests after the first go wrong in a batch", "their logits outside the bound against each "
              "request's own reference", ", ".join(f"nmse {fmt(z.nmse)}" for z in later),
              all(not z.passed for z in later), max(z.nmse for z in later)),
        Check("the second request answers another token", "its top token is not its reference's",
              f"{mine.piece!r} (reference {theirs.piece!r})", mine.id != theirs.id),
        Check("the second request's first attention scores other keys", f"blk.0.attn_scores NMSE > {WRONG_SCORES:g}",
              f"nmse {fmt(scores.nmse)}", scores.nmse > WRONG_SCORES, scores.nmse),
    ]  # fmt: skip


def checklist(ev: BatchEvidence, ref: BatchReference, faulty: BatchEvidence) -> list[Check]:
    cmps = [compare(r, a) for r, a in zip(ev.batch, ref.alone)]
    out = [
        Check("every request of the batch holds its own pass", "each within its bounds against its own reference",
              "; ".join(f"request {k}: {c.first_divergence or 'passes'}" for k, c in enumerate(cmps)),
              all(c.passed for c in cmps)),
    ]  # fmt: skip
    if ref.llamacpp is None:
        return out
    theirs = [compare(r, t) for r, t in zip(ev.batch, ref.llamacpp)]
    return out + [
        Check("llama.cpp computes the same batch", "each request within llama.cpp's bounds against its own batch "
              "(sequence ids over one unified cache)",
              "; ".join(f"request {k}: {c.first_divergence or 'passes'}" for k, c in enumerate(theirs)),
              all(c.passed for c in theirs)),
    ]  # fmt: skip


def clues(ev: BatchEvidence, ref: BatchReference, faulty: BatchEvidence) -> list[Check]:
    """What a one-request test sees, fault or not: the prompt alone, the batch's first request, and the
    second request's own q, k and v, all right."""
    alone, first = compare(ev.alone, ref.alone[0]), _logits(ev.batch[0], ref.alone[0])
    second = compare(ev.batch[1], ref.alone[1])
    own = all(second.row(n).passed for n in ("blk.0.q_rope", "blk.0.k_rope", "blk.0.v"))
    return [
        Check("the prompt served alone is right", "every stage within its bound against the reference",
              "passes" if alone.passed else f"first divergence {alone.first_divergence}", alone.passed),
        Check("the first request of the batch is right", "its logits within their bound",
              f"nmse {fmt(first.nmse)}", first.passed, first.nmse),
        Check("the second request's own q, k and v are right", "layer 0's q_rope, k_rope and v within their bounds",
              "right" if own else "wrong", own),
    ]  # fmt: skip


CASE = Case(
    name="batch-crosstalk",
    postmortem="",
    title="Requests served in one batch read each other's KV cache: right alone, wrong together",
    model="smollm2-135m",
    prompt=PROMPT,
    fault={"kv_sequence": "previous_sequence"},
    fix={"kv_sequence": "default"},
    root_cause_stage="blk.0.attn_scores",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    story=(
        "Servers batch requests: one pass over every request's tokens, each under its own sequence id, each "
        "with its own KV cache. A bookkeeping slip that hands a request another request's cache slots is "
        "silent: nothing fails, the text is fluent, and every check that runs one request at a time passes. "
        "LMCache/LMCache#4385 answered returning sessions from other requests' KV cache; "
        "waybarrios/vllm-mlx#775 corrupted Gemma 4's cache across batched requests."
    ),
    lesson=(
        "Run the paths you serve by: a request alone, then the same request in a batch, each against its own "
        "reference (labkit paths --paths batch=4). A batch fault shows at the first stage that reads another "
        "request's state, the first attention, while every stage before it, the request's own q, k and v, is "
        "right."
    ),
    notes=[
        "Not from the five post-mortems: the serving-paths issue's batch fault (LMCache#4385, vllm-mlx#775) on "
        "SmolLM2. The first request of the batch reads its own cache, so it stays right: the fault needs a "
        "second request to show.",
    ],
)
