"""A blind case: one faulty variant bound in secret, only its symptoms shown.

The post-mortem cases tell their story; a blind case asks the engine developer to find it. A
seed draws one of the model's faulty variants (every faulty kernel and dispatch policy of the
families its stages run; samplers compute no stage), runs the prompt pass, a KV-cached decode
step and a greedy continuation under it (and, where those show nothing, the prompt served in a batch of
requests), and shows what a user of the engine would see. The
learner names the stage where the run first parts from the reference and the op family at
fault; `check` says whether that is right, and `reveal` gives the worked answer: the first
divergence of the prompt pass, or of the decode step when the fault shows only in decode
(post-mortem sky-kaw's). A fault that shows nothing on the prompt is passed over, and said so.

    case = blind_case("smollm2-135m", seed=3)
    print(case.text())                    # symptoms only
    case.check("blk.0.attn_norm", "rmsnorm")
    case.reveal()                          # family, variant, stage, where

    labkit case --blind --seed 3 [--answer STAGE FAMILY] [--reveal]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Check
from labkit.compare import Comparison, compare

BLIND_PROMPT = "The color of the sky is"
# the prompt of a model whose vocabulary cannot spell BLIND_PROMPT (labkit's tiny files: placeholder tokens)
PLACEHOLDER_PROMPT = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31, 2, 8]
NEW_TOKENS = 6
BATCH = 3  # a fault that shows neither alone nor in decode is looked for with the prompt in a batch of this many


@dataclass(frozen=True)
class BlindAnswer:
    """The worked answer: the hidden variant and the first stage where the run parts from the reference."""

    family: str
    variant: str
    stage: str
    where: str  # "prompt pass" or "decode step"
    description: str


@dataclass(frozen=True)
class BlindCase:
    """Symptoms of a hidden fault; `check` an answer, `reveal` the worked one."""

    model: str
    seed: int
    prompt: str
    symptoms: list[str]
    passed_over: list[str] = field(default_factory=list)  # faults drawn first that show nothing here
    _answer: BlindAnswer | None = field(default=None, repr=False)
    kv_flags: str = ""  # the CLI flags of the lab's KV-cache types ("" for f32): the same candidates again

    def check(self, stage: str, family: str) -> Check:
        """Right when both the stage (the first divergence) and the op family are."""
        a = self._answer
        ok_stage, ok_family = stage == a.stage, family == a.family
        said = f"stage {stage!r} {'✓' if ok_stage else '✗'}, family {family!r} {'✓' if ok_family else '✗'}"
        return Check("blind case", "the first divergence and the family at fault", said, ok_stage and ok_family)

    def reveal(self) -> BlindAnswer:
        return self._answer

    def text(self) -> str:
        head = (
            f"blind case {self.seed} on {self.model}{self.kv_flags}: one kernel or dispatch policy is faulty. "
            f"Prompt: {self.prompt!r}"
        )
        over = f"\n(faults passed over, nothing shows on this prompt: {', '.join(self.passed_over)})"
        ask = "\nWhich stage first parts from the reference, and which op family is at fault?"
        return head + "\n" + "\n".join(f"- {s}" for s in self.symptoms) + (over if self.passed_over else "") + ask

    def session(self, answer: tuple[str, str] | None = None, reveal: bool = False) -> tuple[dict, str, bool]:
        """What `labkit case --blind` shows: (data, text, whether the answer, when given, is right)."""
        data, lines, right = self.to_dict(), [self.text()], True
        if answer:
            verdict = self.check(*answer)
            data["check"], right = verdict.to_dict(), verdict.passed
            lines.append(f"{'✓ right' if right else '✗ not it'}: {verdict.observed}")
        if reveal:
            a = self._answer
            data["answer"] = asdict(a)
            lines.append(
                f"worked answer: {a.stage} ({a.where}), family {a.family}, variant {a.variant}: {a.description}"
            )
        elif not answer:
            lines.append(f"answer: labkit case --blind --model {self.model}{self.kv_flags} --seed {self.seed} "
                         "--answer STAGE FAMILY")  # fmt: skip
        return data, "\n".join(lines), right

    def to_dict(self) -> dict:
        return {"model": self.model, "seed": self.seed, "prompt": self.prompt, "symptoms": self.symptoms,
                "passed_over": self.passed_over}  # fmt: skip


def candidates(lab: Any) -> list[tuple[str, str]]:
    """Every faulty kernel and dispatch policy of the families this model's stages run, sorted."""
    from labkit.ops import OPS
    from labkit.ops.registry import get_policy, is_faulty

    used = {lab.executor.family(st) for st in lab.graph} | {st.policy for st in lab.graph if st.policy}
    used |= {f for st in lab.graph for f in OPS[st.op].policy_families(st) if get_policy(f).every_stage}
    found = [(f, n) for f, names in lab.variants().items() if f in used for n in names if n != "default"]
    return sorted((f, n) for f, n in found if is_faulty(f, n))


def blind_case(model: str = "smollm2-135m", seed: int = 0, lab: Any = None, prompt: str = BLIND_PROMPT) -> BlindCase:
    """Draw a faulty variant by `seed` (passing over those that show nothing on `prompt`) and gather
    its symptoms. `lab`: a live Lab of the model to reuse; its selection is put back afterwards."""
    from labkit.lab import open as open_lab

    lab = lab or open_lab(model)
    ids, prompt = _prompt_ids(lab, prompt)
    ref = _reference(lab, ids)
    order = candidates(lab)
    passed_over = []
    for i in np.random.default_rng(seed).permutation(len(order)):
        case = _case_of(lab, *order[int(i)], ids, ref, prompt, seed)
        if case is not None:
            return BlindCase(case.model, seed, prompt, case.symptoms, passed_over, case._answer, case.kv_flags)
        passed_over.append("=".join(order[int(i)]))
    raise RuntimeError(f"no faulty variant shows on {prompt!r}")  # every model has faults that show


def _prompt_ids(lab: Any, prompt: str | list[int]) -> tuple[list[int], str | list[int]]:
    """(ids, the prompt as shown): the default text, or the placeholder ids where the vocabulary has no
    tokens for it (a tiny file labkit wrote); a prompt the caller gave is never replaced."""
    from labkit.errors import LabkitError

    try:
        return lab.prompt_ids(prompt), prompt
    except LabkitError:
        if prompt != BLIND_PROMPT:
            raise
        return lab.prompt_ids(PLACEHOLDER_PROMPT), PLACEHOLDER_PROMPT


def blind_case_of(lab: Any, family: str, variant: str, prompt: str = BLIND_PROMPT) -> BlindCase | None:
    """The blind case of one given faulty variant (None when it shows nothing on `prompt`)."""
    ids, prompt = _prompt_ids(lab, prompt)
    return _case_of(lab, family, variant, ids, _reference(lab, ids), prompt, -1)


def blind_cases(lab: Any, prompt: str = BLIND_PROMPT) -> dict[tuple[str, str], BlindCase | None]:
    """Every faulty variant's blind case, keyed (family, variant), None where it shows nothing on
    `prompt`: a survey of the model's faults, against one reference run rather than one per fault."""
    ids, prompt = _prompt_ids(lab, prompt)
    ref = _reference(lab, ids)
    return {(f, v): _case_of(lab, f, v, ids, ref, prompt, -1) for f, v in candidates(lab)}


@dataclass
class _Reference:
    prompt: Run
    step: Run
    text: str


def _reference(lab, ids: list[int]) -> _Reference:
    text = lab.generate_reference(ids, NEW_TOKENS).text
    return _Reference(lab.reference(ids), lab.decode_step(ids, "reference"), text)


def _case_of(lab, family: str, variant: str, ids: list[int], ref: _Reference, prompt_text: str, seed: int):
    """The case under one faulty variant, or None when nothing diverges."""
    from labkit.ops.registry import describe

    before = lab.selected.get(family, "default")
    lab.use(family, variant)
    try:
        run = lab.run(ids)
        step = lab.decode_step(ids)
        text = lab.generate(ids, NEW_TOKENS).text
    finally:
        lab.use(family, before)
    p_cmp, s_cmp = compare(run, ref.prompt), compare(step, ref.step)
    stage, where = (
        (p_cmp.first_divergence, "prompt pass") if not p_cmp.passed else (s_cmp.first_divergence, "decode step")
    )
    b_cmp = None
    if stage is None:  # served alone it shows nothing: the prompt in a batch, as a server runs it
        b_cmp = compare(_in_batch(lab, family, variant, ids), ref.prompt)
        stage, where = b_cmp.first_divergence, f"prompt in a batch of {BATCH}"
    if stage is None:  # neither the prompt pass, its decode step nor a batch parts from the reference
        return None
    answer = BlindAnswer(family, variant, stage, where, describe(family, variant))
    types = getattr(lab, "kv_types", None)
    flags = "" if types is None or str(types) == "f32" else f" --kv-type-k {types.k} --kv-type-v {types.v}"
    symptoms = _symptoms(run, step, text, p_cmp, s_cmp, ref)
    if b_cmp is not None:
        symptoms.append(f"served in a batch of {BATCH} requests, the prompt's logits NMSE against the reference: "
                        f"{b_cmp.row('logits').nmse:.2e}")  # fmt: skip
    return BlindCase(lab.name, seed, prompt_text, symptoms, [], answer, flags)


def _in_batch(lab, family: str, variant: str, ids: list[int]) -> Run:
    """The prompt's run served last in a batch of BATCH sequences, under the variant."""
    from labkit.serving_paths import batch_companions

    before = lab.selected.get(family, "default")
    lab.use(family, variant)
    try:
        return lab.run_batch([*batch_companions(ids, BATCH), ids])[-1]
    finally:
        lab.use(family, before)


def _symptoms(prompt: Run, step: Run, text: str, p_cmp: Comparison, s_cmp: Comparison, ref: _Reference) -> list[str]:
    """What a user of the engine sees, with no stage named: output, top tokens, logits' distance."""
    top = ", ".join(f"{t.piece!r} {t.prob:.2f}" for t in prompt.top(3))
    ref_top = ", ".join(f"{t.piece!r} {t.prob:.2f}" for t in ref.prompt.top(3))
    bad = int(np.size(prompt.logits()) - np.isfinite(prompt.logits()).sum())
    return [
        f"greedy continuation: {text!r} (reference: {ref.text!r})",
        f"top-3 after the prompt: {top} (reference: {ref_top})",
        f"logits NMSE against the reference: prompt pass {p_cmp.row('logits').nmse:.2e}, "
        f"decode step of the last token {s_cmp.row('logits').nmse:.2e}",
        f"non-finite logits at the last position: {bad}",
    ]
