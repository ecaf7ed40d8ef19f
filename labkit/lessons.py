"""Exercise checks for the lesson notebooks (notebooks/01–04).

An exercise cell sets `answer = ...`; its check cell calls `check(...)` with the value the lesson
computes from the run's own captures (plain numpy over the arrays, written out in this module so a
student can read how the answer is found after trying). The check shows ✓ or ✗ with a hint.

    check("3.1 ' blue' enters the top 10", answer, layer_entering_top(lens.ranks(blue), 10))
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.captures import Run
from labkit.kernel_trial import KernelTimes


@dataclass(frozen=True, repr=False)
class Check:
    """One exercise's verdict: shows as a green ✓ or a red ✗ line in a notebook."""

    exercise: str
    passed: bool
    message: str
    answered: bool = True  # False: the student cell still holds `answer = ...`

    def __str__(self) -> str:
        mark = "✓" if self.passed else "✗" if self.answered else "○"
        return f"{mark} {self.exercise}: {self.message}"

    __repr__ = __str__  # a notebook's text/plain and a terminal show the verdict, not the fields

    def _repr_html_(self) -> str:
        color = "#2a7" if self.passed else "#c00" if self.answered else "#888"
        return f"<div class='labkit-check' style='color:{color}'><b>{html.escape(str(self))}</b></div>"


def check(exercise: str, answer: Any, expected: Any, hint: str = "", tol: float | None = None) -> Check:
    """Compare an answer with the expected value (numbers within `tol` when given)."""
    if answer is Ellipsis or (isinstance(answer, tuple) and any(a is Ellipsis for a in answer)):
        return Check(exercise, False, "nothing written yet: write your answer in the cell above and run it", False)
    if tol is not None:
        try:
            a, b = np.asarray(answer, float), np.asarray(expected, float)
            ok = a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=tol))
        except (TypeError, ValueError):  # not numbers: a wrong answer, not a crash
            ok = False
    else:
        ok = _same(answer, expected)
    if ok:
        return Check(exercise, True, f"correct ({_short(expected)})")
    return Check(exercise, False, f"{_short(answer)} is not it" + (f"; hint: {hint}" if hint else ""))


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, np.ndarray) or isinstance(a, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(b, (int, np.integer)) and isinstance(a, (int, np.integer)):
        return int(a) == int(b)
    return a == b


def _short(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"array {x.shape}"
    if isinstance(x, (set, frozenset)):
        return "{" + ", ".join(repr(v) for v in sorted(x, key=repr)) + "}"  # the same text every run
    return repr(x)


# ----- what the lessons' exercises ask, computed from the captures with plain numpy


def previous_token_head(run: Run, layer: int) -> int:
    """The head of `layer` whose queries put the most probability on the key just before them."""
    p = np.asarray(run[f"blk.{layer}.attn_probs"], dtype=np.float64)  # [heads, T, T]
    T = p.shape[1]
    prev = p[:, np.arange(1, T), np.arange(0, T - 1)]  # [heads, T-1]
    return int(np.argmax(prev.mean(axis=1)))


def induction_pairs(tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(queries, keys) where an induction head should look: each query whose token appeared
    before, and the key just after that token's latest earlier occurrence (what followed it then).
    Read from the token ids, so a prompt's period need not be counted by hand."""
    last: dict[int, int] = {}
    queries, keys = [], []
    for t, tok in enumerate(tokens):
        if tok in last:
            queries.append(t)
            keys.append(last[tok] + 1)
        last[tok] = t
    return np.array(queries, dtype=np.int64), np.array(keys, dtype=np.int64)


def induction_head(run: Run) -> tuple[int, int]:
    """(layer, head) with the highest mean probability on the induction keys of `run`'s prompt."""
    qs, ks = induction_pairs(list(run.tokens))
    layers = sorted({int(s.split(".")[1]) for s in run.stages if s.endswith(".attn_probs")})
    score = np.array([np.asarray(run[f"blk.{L}.attn_probs"], np.float64)[:, qs, ks].mean(axis=1) for L in layers])
    L, h = np.unravel_index(int(np.argmax(score)), score.shape)
    return layers[int(L)], int(h)


def layer_entering_top(ranks: list[int], k: int) -> int | None:
    """The first layer at which a token's rank (0 = top-1) is below k, from its ranks per layer."""
    return next((L for L, r in enumerate(ranks) if r < k), None)


def rms_norm_by_hand(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w, in float64 (what the attn_norm stage computes)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x) + eps) * np.asarray(w, dtype=np.float64)


@dataclass(frozen=True, repr=False)
class MysteryFault:
    """A run with one kernel broken in one layer, chosen by a seed and not shown: the lesson's
    blind case. `key` and `variant` are there for the check; a student finds them with tools."""

    run: Run
    key: str  # "blk.L.family"
    variant: str

    def __repr__(self) -> str:
        return f"MysteryFault(run of {len(self.run.tokens)} tokens; which kernel and layer is the exercise)"


# faults that stay inside the stages of their own kernel (each checked by test_attribution on both models)
_MYSTERY_FAULTS = (("rmsnorm", "scale_clamp"), ("rope", "normal_pairs"))


def mystery_fault(lab: Any, prompt: str, seed: int) -> MysteryFault:
    """Run `prompt` with one of a few faulty kernels bound to one layer, picked by `seed`."""
    rng = np.random.default_rng(seed)
    family, variant = _MYSTERY_FAULTS[int(rng.integers(len(_MYSTERY_FAULTS)))]
    key = f"blk.{int(rng.integers(1, lab.config.n_layers - 1))}.{family}"
    before = lab.selected.get(key, "default")
    lab.use(key, variant)
    try:
        run = lab.run(prompt)
    finally:
        lab.use(key, before)
    return MysteryFault(run, key, variant)


def stages_of(lab: Any, key: str) -> list[str]:
    """The stages a layer-bound kernel key (`blk.L.family`) runs, in graph order: read from the
    graph and each stage's kernel family, not from any comparison."""
    _, layer, family = key.split(".", 2)
    return [st.name for st in lab.graph if st.layer == int(layer) and lab.executor.family(st) == family]


def kv_cache_bytes(config: Any, positions: int, itemsize: int = 2, gqa: bool = True, window: bool = True) -> int:
    """Bytes of a KV cache holding `positions` tokens: per layer K and V, each [kept positions,
    KV heads x head_dim]. gqa=False counts a head of K and V per query head (multi-head attention);
    window=False keeps every position in the sliding-window layers too."""
    heads = config.n_kv_heads if gqa else config.n_heads
    total = 0
    for layer in range(config.n_layers):
        w = config.layer_window(layer) if window else None
        kept = min(positions, w) if w else positions
        total += 2 * kept * heads * config.head_dim * itemsize
    return total


def min_p_ids(logits: np.ndarray, min_p: float, temperature: float = 1.0) -> np.ndarray:
    """Min-p: the ids whose probability (at `temperature`) is at least min_p × the top one's, by
    falling probability. Written out plainly for lesson 07's check."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    return order[p[order] >= min_p * p[order[0]]]


def temperature_last(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's default chain (common_params_sampling::samplers): top-k, top-p and min-p cut the
    candidates on the unscaled distribution, then the temperature scales what is left."""
    z = np.asarray(logits, np.float64)
    ids = np.argsort(-z, kind="stable")
    if top_k > 0:
        ids = ids[:top_k]
    p = np.exp(z[ids] - z[ids].max())
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        ids, p = ids[:keep], p[:keep] / p[:keep].sum()
    if min_p > 0.0:
        ids = ids[p >= min_p * p[0]]
    q = np.exp((z[ids] - z[ids].max()) / temperature)
    return ids, q / q.sum()


# ----- lesson 11: a kernel the student writes, checked and timed on the real model


def check_kernel(exercise: str, wgsl: Any, lab: Any, prompt: Any, family: str, reference: Run, name: str,
                 hint: str = "") -> Check:  # fmt: skip
    """Register the student's WGSL as `family/name`, run the model with it in every layer and judge
    it against the reference: the first stage that departs and the stages attribution blames."""
    from labkit.errors import LabkitError
    from labkit.kernel_trial import try_kernel

    if wgsl is Ellipsis:
        return check(exercise, wgsl, None)
    if not isinstance(wgsl, str):
        return Check(exercise, False, f"{_short(wgsl)} is not WGSL: give the kernel's source as a string")
    try:
        trial = try_kernel(lab, prompt, family, wgsl, name, reference=reference)
    except LabkitError as e:  # compile errors and interface errors name the WGSL line or the binding
        return Check(exercise, False, f"{type(e).__name__}: {e}")
    if trial.correct:
        return Check(exercise, True, f"correct: {trial.headline}")
    return Check(exercise, False, trial.text() + (f"; hint: {hint}" if hint else ""))


def kernel_bench(lab: Any, prompt: Any, family: str, variants: list[str], kinds: tuple[str, ...],
                 repeats: int = 3) -> KernelTimes:  # fmt: skip
    """Time the variants registered so far against the first (a student's kernel whose exercise's check
    has not run yet is left out, and said so; one its check registered is timed, passing or not); print
    each one's GPU time as a multiple of the first's. The times, for `figures.kernel_times`."""
    from labkit.kernel_trial import time_kernels
    from labkit.ops.registry import resolve_family
    from labkit.ops.registry import variants as registered

    known = set(registered()[resolve_family(family)]) | {"default"}
    missing = [v for v in variants if v not in known]
    if missing:
        print(f"○ not registered yet: {', '.join(missing)} (their exercises' checks register them)")
    times = time_kernels(lab, prompt, family, [v for v in variants if v in known], kinds, repeats)
    first = next(iter(times.ms))
    for v in times.ms:
        print(f"{v:>12}: {times.median(v):8.2f} ms, {times.ratio(v, first):6.2f}x the time of {first}")
    return times


def repetition_penalty(logits: np.ndarray, recent: Any, penalty: float) -> np.ndarray:
    """llama.cpp's repeat penalty (llama_sampler_penalties_apply) for lesson 07's check: each distinct
    id among the recent tokens, however often it occurred, has a positive logit divided by `penalty`
    and a zero or negative one multiplied by it (dividing a negative logit would raise it)."""
    z = np.array(logits, dtype=np.float64)
    for t in sorted({int(i) for i in np.asarray(recent).reshape(-1)}):
        z[t] = z[t] / penalty if z[t] > 0 else z[t] * penalty
    return z


def seeded_draws(ids: np.ndarray, probs: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n token ids drawn from (ids, probs) by numpy's Generator.choice with default_rng(seed), for
    lesson 07's check of a hand-written draw: choice inverts the cumulative distribution over the
    same rng.random(n) numbers, so a correct inverse-CDF draw gives these very ids."""
    pick = np.random.default_rng(seed).choice(len(ids), size=n, p=np.asarray(probs, dtype=np.float64))
    return np.asarray(ids)[pick]
