"""lm-head-unwritten (post-mortem 002): the output matmul leaves rows of the logits unwritten.

In the post-mortem (Qwen2.5, 151 936-token vocabulary) the lm_head GEMM did not write every
vocabulary position; the stale values left there (~14-15, above every legitimate logit) won
argmax, and one token (" coholic") came out again and again. SmolLM2-135M is the same kind of
model here (a GQA llama with a tied 49 152-row head). It is opened with 4 MiB weight windows
so the head is split into 8 row windows, and the fault `lm_head=skip_last_window` never
dispatches the last one: rows 47 971-49 151 (1 181 rows) keep whatever the buffer held.

WebGPU zero-fills new buffers, so without help the unwritten logits read 0.0 and never win
(the bug hides: a misleading clue, below). Debug mode poisons every output before the pass with
a NaN payload, as uninitialized memory would hold garbage; `np.argmax` returns the first NaN,
so the naive argmax lands on row 47 971 (" insensitive") at every step. Measured on
"The color of the sky is" (6 tokens):

| | faulty | fixed |
|---|---|---|
| unwritten logits (prompt pass) | 7086 = 6 positions x 1181 rows, rows 47971-49151 | 0 |
| argmax of the raw logits | 47971 " insensitive" (unwritten) | 253 " a" |
| greedy, naive argmax, 5 steps | " insensitive" x 5 | " a classic example of a" (= reference) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Case, Check, Evidence, Localization
from labkit.casebook.tools import GreedyReference, greedy_reference
from labkit.compare import compare
from labkit.gpu.pass_request import PassRequest

PROMPT = "The color of the sky is"
WINDOW_BYTES = 4 << 20  # 612-byte Q8_0 rows: 6853 rows per window, 8 windows
N_NEW = 5


def _ranges(rows: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous [first, last] row ranges of a sorted index array."""
    if rows.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(rows) != 1)
    starts = np.concatenate([[rows[0]], rows[cuts + 1]])
    ends = np.concatenate([rows[cuts], [rows[-1]]])
    return [(int(a), int(b)) for a, b in zip(starts, ends)]


def _unwritten_rows(z: np.ndarray) -> np.ndarray:
    from labkit.poison import POISON_BITS

    z = np.ascontiguousarray(z, dtype=np.float32)
    return np.flatnonzero(z.view(np.uint32) == POISON_BITS)


class DecodeStep(NamedTuple):
    """One step of the post-mortem's loop: np.argmax over the raw logits buffer (debug poison on)."""

    argmax: int  # the token np.argmax picked, fed to the next step
    unwritten: int  # logits still holding the poison after the pass
    ranges: list[tuple[int, int]]  # those rows as [first, last] ranges


class RowWindow(NamedTuple):
    """One row window of the tied head, as the GPU binds it."""

    first_row: int
    n_rows: int


@dataclass(kw_only=True)
class LmHeadEvidence(Evidence):
    """One side: a debug (poisoned) and a normal prompt pass, the argmax decode loop, the head's windows."""

    prompt: Run  # debug=True: outputs poisoned before the pass, `prompt.unwritten` counts what stayed
    plain: Run  # debug=False, logits only: what a normal run shows
    steps: list[DecodeStep]
    greedy: list[int]  # the argmax of each step
    text: str
    windows: list[RowWindow]


def reference(lab) -> GreedyReference:
    return greedy_reference(lab, PROMPT, N_NEW)


def observe(lab, side: str, variants: dict[str, str], ref: Evidence | None) -> LmHeadEvidence:
    ids = lab.prompt_ids(PROMPT, extra=N_NEW)
    prompt = lab.run(PROMPT, debug=True)  # poison first: unwritten = still poison afterwards
    plain = lab.run(PROMPT, names=["logits"], debug=False)  # what a normal run shows
    # the post-mortem's loop: argmax over the raw logits buffer, one decode pass per token
    ex = lab.executor
    state = ex.new_state(len(ids) + N_NEW)
    res = ex.run_pass(PassRequest(ids, names=("logits",), last_logits_only=True, debug=True), state)
    steps: list[DecodeStep] = []
    while True:
        z = res.captures["logits"][-1]
        rows = _unwritten_rows(z)
        steps.append(DecodeStep(int(np.argmax(z)), int(rows.size), _ranges(rows)))
        if len(steps) == N_NEW:
            break
        res = ex.run_pass(PassRequest([steps[-1].argmax], names=("logits",), last_logits_only=True, debug=True), state)
    greedy = [s.argmax for s in steps]
    return LmHeadEvidence(
        side=side,
        variants=variants,
        prompt=prompt,
        plain=plain,
        steps=steps,
        greedy=greedy,
        text=lab.detokenize(greedy),
        windows=[RowWindow(w.first_row, w.n_rows) for w in ex.weight("token_embd.weight").windows],
    )


def localize(lab, faulty: LmHeadEvidence, ref: GreedyReference) -> Localization:
    with np.errstate(invalid="ignore"):  # the poison is a signalling NaN: casting it warns
        cmp = compare(faulty.prompt, ref.prompt)
    return Localization(cmp.first_divergence, cmp)


def _describe_rows(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}-{b}" for a, b in ranges) or "none"


def symptoms(ev: LmHeadEvidence, ref: GreedyReference, faulty: LmHeadEvidence) -> list[Check]:
    run = ev.prompt
    z = run["logits"][-1]
    rows = _unwritten_rows(z)
    ranges = _ranges(rows)
    n = int(run.unwritten.get("logits", 0))
    others = {k: v for k, v in run.unwritten.items() if v and k != "logits"}
    top = int(np.argmax(z))
    greedy = ev.greedy
    return [
        Check(
            "poison detection names unwritten logits",
            "unwritten logits > 0 after the pass (debug poison still there), and no other stage has any",
            f"{n} unwritten in logits ({len(rows)} per position: rows {_describe_rows(ranges)}); "
            f"other stages: {others or 'none'}",
            n > 0 and not others,
            {"unwritten": n, "rows": ranges},
        ),
        Check(
            "argmax of the raw logits lands in the unwritten rows",
            "np.argmax over the last position's logits buffer is an unwritten row",
            f"argmax {top} {run.piece(top)!r} ({'unwritten' if top in set(rows.tolist()) else 'written'})",
            bool(top in set(rows.tolist())),
            top,
        ),
        Check(
            "the same token repeats",
            f"greedy decode with np.argmax: all {N_NEW} tokens identical",
            f"{ev.text!r} {greedy}",
            len(set(greedy)) == 1,
            greedy,
        ),
    ]


def checklist(ev: LmHeadEvidence, ref: GreedyReference, faulty: LmHeadEvidence) -> list[Check]:
    run = ev.prompt
    steps = ev.steps
    unwritten = int(run.unwritten.get("logits", 0)) + sum(s.unwritten for s in steps)
    z = run["logits"][-1]
    rows = set(_unwritten_rows(z).tolist())
    top = int(np.argmax(z))
    ref_top = int(np.argmax(ref.prompt.logits()))
    greedy = ev.greedy
    runs3 = any(greedy[i] == greedy[i + 1] == greedy[i + 2] for i in range(len(greedy) - 2))
    return [
        Check(
            "every vocabulary position is written",
            "0 unwritten logits in the prompt pass and in every decode step",
            f"{unwritten} unwritten",
            unwritten == 0,
            unwritten,
        ),
        Check(
            "argmax over the legitimate range",
            "the argmax of the raw logits is a written row and is the reference's argmax",
            f"argmax {top} {run.piece(top)!r}; reference {ref_top} {run.piece(ref_top)!r}",
            top not in rows and top == ref_top,
            top,
        ),
        Check(
            "diverse tokens, no repetition loop",
            f"no token 3 times in a row and >= 3 distinct tokens among the {N_NEW} greedy tokens",
            f"{len(set(greedy))} distinct: {ev.text!r}",
            not runs3 and len(set(greedy)) >= 3,
            len(set(greedy)),
        ),
        Check(
            "output matches the reference",
            f"greedy tokens equal the reference's {ref.text!r}",
            f"{ev.text!r}",
            greedy == ref.greedy,
            greedy,
        ),
    ]


def clues(ev: LmHeadEvidence, ref: GreedyReference, faulty: LmHeadEvidence) -> list[Check]:
    plain = ev.plain
    z = plain["logits"][-1]
    zeros = int(np.sum(z == 0.0))
    top = int(np.argmax(z))
    ref_top = int(np.argmax(ref.prompt.logits()))
    windows = ev.windows
    return [
        Check(
            "without poison the bug hides",
            "a normal (non-debug) pass reads unwritten rows as 0.0 (WebGPU zero-fills buffers), below the "
            "winning logit: its argmax is the reference's",
            f"{zeros} logits exactly 0.0 at the last position; argmax {top} {plain.piece(top)!r} (reference {ref_top})",
            top == ref_top,
            zeros,
        ),
        Check(
            "the lm_head weights are fine",
            "the head is split into several row windows; the weights are the file's (the fault is in dispatch)",
            f"{len(windows)} windows of the tied embedding: " + ", ".join(f"{a}+{n}" for a, n in windows),
            len(windows) > 1,
            len(windows),
        ),
    ]


CASE = Case(
    name="lm-head-unwritten",
    postmortem="002",
    title="the lm_head leaves its last row window unwritten; poison wins argmax and repeats",
    model="smollm2-135m",
    prompt=PROMPT,
    fault={"lm_head": "skip_last_window"},
    fix={"lm_head": "default"},
    root_cause_stage="logits",
    symptoms=symptoms,
    checklist=checklist,
    clues=clues,
    reference=reference,
    observe=observe,
    localize=localize,
    open_kwargs={"window_bytes": WINDOW_BYTES},
    story=(
        "A Qwen2.5 worker generated ' coholic' (id 44394) over and over. Logging showed a few logits "
        "at 14-15 while legitimate ones lay in -4.7..4.5, and argmax took the outliers. The lm_head "
        "weights at those rows were correct; vocab size was not the problem either. The GEMM simply "
        "did not write every position of the logits buffer, and the stale memory left there won."
    ),
    lesson=(
        "Poison output buffers before a pass and count what is still poison afterwards: it names "
        "the unwritten rows instead of leaving you to guess from garbage. A zero-filled buffer hides "
        "the bug (0 rarely wins argmax); stale memory or NaN exposes it. The first divergence is the "
        "logits stage itself: everything upstream is written and right."
    ),
    notes=[
        "The post-mortem's garbage was stale memory (~14-15); here it is the debug poison (a NaN payload), "
        "which np.argmax picks first. Without debug, WebGPU's zero-fill hides the fault (see the clue).",
        "The unwritten rows are one contiguous block (the last window), where the post-mortem saw scattered "
        "positions (44394, 137131).",
    ],
)
