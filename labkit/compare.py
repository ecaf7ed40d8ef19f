"""Per-stage comparison of two runs, in the manner of ggml's test-backend-ops.

nmse = Σ(a−b)² / Σb² over finite values, with a threshold per stage kind; any NaN
in `a`, any inf mismatch, or any unwritten element fails the stage outright. The
first failing stage in graph order is `first_divergence`, and the first position
whose own NMSE fails there is `first_divergence_position`.

Nothing here may mislead quietly: stages are ordered by the model's graph whatever
order the runs list them in, two runs with no stage in common raise, and the
thresholds come from both runs' precisions (labkit.precision) unless the caller
gives them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import numpy as np

from labkit.captures import (  # stage_kind re-exported
    ID_KINDS,
    SLOT_KINDS,
    Run,
    as_f64,
    graph_sorted,
    is_attention_map,
    stage_kind,
)
from labkit.errors import NoCommonStagesError
from labkit.logits_agreement import LogitsAgreement, logits_agreement
from labkit.precision import DEFAULT_THRESHOLD, REFERENCE_THRESHOLDS, looser, thresholds_for

__all__ = ["REFERENCE_THRESHOLDS", "Comparison", "StageComparison", "compare", "compare_arrays", "stage_kind"]


@dataclass(frozen=True)
class StageComparison:
    stage: str
    nmse: float
    max_abs: float
    threshold: float
    passed: bool
    reason: str = ""  # why it failed when it is not the NMSE (nan, inf mismatch, unwritten, shape)
    positions: tuple[int, ...] = ()  # the positions compared (query positions of an attention map)
    nmse_per_position: tuple[float, ...] = ()  # one NMSE per entry of `positions`
    first_bad_position: int | None = None  # the first position that fails on its own


@dataclass
class Comparison:
    """Per-stage rows in graph order; `missing` lists stages one side lacks."""

    a_engine: str
    b_engine: str
    rows: list[StageComparison]
    missing: list[str] = field(default_factory=list)
    thresholds_used: str = ""  # which table, and why (the two precisions, or the caller's)
    model: str = ""  # the compared runs' model (a's), for titles
    a_variants: dict[str, str] = field(default_factory=dict)  # the kernel variants each run used
    b_variants: dict[str, str] = field(default_factory=dict)
    logits: LogitsAgreement | None = None  # KL and top-1 agreement per position, where both hold finite logits

    @property
    def passed(self) -> bool:
        """Every compared stage passed, and at least one stage was compared."""
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def first_divergence(self) -> str | None:
        return next((r.stage for r in self.rows if not r.passed), None)

    @property
    def first_divergence_position(self) -> int | None:
        """At the first divergent stage, the first position whose own NMSE fails (or that holds a
        NaN, inf mismatch or unwritten element). A fault at the last position only shows here."""
        return next((r.first_bad_position for r in self.rows if not r.passed), None)

    def row(self, stage: str) -> StageComparison:
        return next(r for r in self.rows if r.stage == stage)

    def headline(self) -> str:
        """One line: where the runs part, or that they agree."""
        if self.passed:
            return f"no divergence: all {len(self.rows)} compared stages pass"
        first = self.row(self.first_divergence)
        where = f" at position {first.first_bad_position}" if first.first_bad_position is not None else ""
        agree = ""
        if first.first_bad_position is not None and first.positions and first.first_bad_position != first.positions[0]:
            agree = f" (positions {first.positions[0]}..{first.first_bad_position - 1} agree)"
        why = first.reason if first.reason != "nmse" else f"nmse {first.nmse:.3e} > {first.threshold:.0e}"
        return f"first divergence: {first.stage}{where}{agree}: {why}"

    def table(self, only_failed: bool = False) -> str:
        head = f"{'stage':28} {'nmse':>10} {'thresh':>8} {'max|a-b|':>10}  result"
        lines = [self.headline(), f"{self.a_engine} vs {self.b_engine}; thresholds: {self.thresholds_used}", head]
        for r in self.rows:
            if only_failed and r.passed:
                continue
            mark = ("ok" + (f" ({r.reason})" if r.reason else "")) if r.passed else "FAIL " + failure_reason(r)
            lines.append(f"{r.stage:28} {r.nmse:10.3e} {r.threshold:8.0e} {r.max_abs:10.3e}  {mark}")
        if self.missing:
            lines.append("not compared: " + ", ".join(self.missing))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr style='color:{'inherit' if r.passed else '#c00'}'><td>{r.stage}</td><td>{r.nmse:.3e}</td>"
            f"<td>{r.threshold:.0e}</td><td>{r.max_abs:.3e}</td>"
            f"<td>{'ok' if r.passed else 'FAIL ' + failure_reason(r)}</td></tr>"
            for r in self.rows
        )
        missing = f"<p>not compared: {', '.join(self.missing)}</p>" if self.missing else ""
        return (
            f"<b>{self.a_engine} vs {self.b_engine}</b>: {self.headline()}"
            f"<div style='color:#666'>thresholds: {self.thresholds_used}</div>"
            f"<table><tr><th>stage</th><th>nmse</th><th>thresh</th><th>max|a-b|</th><th></th></tr>{rows}</table>"
            f"{missing}"
        )

    def to_dict(self) -> dict:
        return {
            "a": self.a_engine,
            "b": self.b_engine,
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "first_divergence_position": self.first_divergence_position,
            "thresholds": self.thresholds_used,
            "missing": self.missing,
            "stages": [asdict(r) for r in self.rows],
            "logits": asdict(self.logits)
            | {"mean_kl": self.logits.mean_kl, "top1_agreement": self.logits.top1_agreement}
            if self.logits
            else None,
        }


def failure_reason(r: StageComparison) -> str:
    """The failure as people read it: `nmse 3.1e-02 > 1e-05`, or the reason that is not the NMSE
    with the NMSE beside it (`inf mismatch (nmse 3.111e-14, threshold 1e-05)`): a ">" only where
    the NMSE really is above its threshold."""
    if r.reason == "nmse":
        return f"nmse {r.nmse:.3e} > {r.threshold:.0e}"
    return f"{r.reason} (nmse {r.nmse:.3e}, threshold {r.threshold:.0e})"


def _fault(
    a: np.ndarray, b: np.ndarray, nmse: float, threshold: float, unwritten: int = 0, finite: bool = False
) -> str:
    """Why `a` fails against `b`, or "" when it passes. finite: both are known to be all finite."""
    if unwritten:
        return f"{unwritten} unwritten"
    if finite:
        return "" if nmse <= threshold else "nmse"
    if np.isnan(a).any():
        return f"{int(np.isnan(a).sum())} NaN"
    if not np.array_equal(np.isposinf(a), np.isposinf(b)) or not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return "inf mismatch"
    return "" if nmse <= threshold else "nmse"


class _Stats(NamedTuple):
    num: np.ndarray  # per position: Σ(a−b)² over the elements finite on both sides
    den: np.ndarray  # per position: Σb² over the same
    broken: np.ndarray  # per position: a NaN in a, or an inf where b has none (or the other sign)
    finite: bool  # every element of both is finite
    max_abs: float


BLOCK_VALUES = 1 << 22  # a large 2-D stage is compared in row blocks of this many values


def _stats(a: np.ndarray, b: np.ndarray, axis: int) -> _Stats:
    """Per-position sums, in row blocks for a large 2-D stage: Gemma's logits at 512 tokens are
    134M values, and whole-array temporaries of 1 GB cost more in page faults than in arithmetic."""
    if a.ndim != 2 or axis != 0 or a.size <= BLOCK_VALUES:
        return _block_stats(as_f64(a), as_f64(b), axis)
    step = max(1, BLOCK_VALUES // max(a.shape[1], 1))
    parts = [_block_stats(as_f64(a[i : i + step]), as_f64(b[i : i + step]), 0) for i in range(0, a.shape[0], step)]
    return _Stats(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("num", "den", "broken")),
                  all(p.finite for p in parts), max(p.max_abs for p in parts))  # fmt: skip


def _block_stats(a: np.ndarray, b: np.ndarray, axis: int) -> _Stats:
    other = tuple(i for i in range(a.ndim) if i != axis)
    with np.errstate(invalid="ignore", over="ignore"):  # inf-inf and huge squares are masked out below
        d = a - b
        if np.isfinite(d).all() and np.isfinite(b).all():  # the common case: no masks, no inf bookkeeping
            max_abs = float(max(d.max(), -d.min())) if d.size else 0.0
            return _Stats(_sum_sq(d, axis), _sum_sq(b, axis), np.zeros(a.shape[axis], bool), True, max_abs)
        both = np.isfinite(a) & np.isfinite(b)
        num = np.where(both, d * d, 0.0).sum(axis=other)
        den = np.where(both, b * b, 0.0).sum(axis=other)
        max_abs = float(np.max(np.abs(d), where=np.isfinite(d), initial=0.0))
    broken = (np.isnan(a) | (np.isposinf(a) != np.isposinf(b)) | (np.isneginf(a) != np.isneginf(b))).any(axis=other)
    return _Stats(num, den, broken, False, max_abs)


def _sum_sq(x: np.ndarray, axis: int) -> np.ndarray:
    """Σx² over every axis but `axis`, without a squared copy."""
    letters = "abcdefgh"[: x.ndim]
    return np.einsum(f"{letters},{letters}->{letters[axis]}", x, x)


def nmse_of(a: np.ndarray, b: np.ndarray) -> float:
    """Σ(a−b)²/Σb² over the elements finite on both sides (per-position sums, in blocks when large)."""
    if np.shape(a) != np.shape(b):
        return float("inf")
    a2, b2 = (a, b) if np.ndim(a) else (np.reshape(a, 1), np.reshape(b, 1))
    st = _stats(a2, b2, 0)
    den = float(st.den.sum())
    return float(st.num.sum()) / den if den > 0 else float(st.num.sum())


def compare_arrays(
    stage: str,
    a: np.ndarray,
    b: np.ndarray,
    threshold: float,
    unwritten: int = 0,
    positions: tuple[int, ...] | None = None,
) -> StageComparison:
    """One stage: its NMSE overall and per position (rows of a vector, query rows of an attention map)."""
    a, b = np.asarray(a), np.asarray(b)
    if np.shape(a) != np.shape(b):
        return StageComparison(stage, np.inf, np.inf, threshold, False, f"shape {np.shape(a)} vs {np.shape(b)}")
    a2, b2 = (a, b) if np.ndim(a) else (np.reshape(a, 1), np.reshape(b, 1))
    axis = 1 if is_attention_map(stage) and a2.ndim == 3 else 0
    num, den, broken, finite, max_abs = _stats(a2, b2, axis)  # as_f64 per block: a debug run's poison is
    nmse = float(num.sum() / den.sum()) if den.sum() > 0 else float(num.sum())  # a signalling NaN, cast quietly
    if not finite:
        a, b = as_f64(a), as_f64(b)
    reason = _fault(a, b, nmse, threshold, unwritten, finite)
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(den > 0, num / np.where(den > 0, den, 1.0), num)
    positions = tuple(range(len(per))) if positions is None else tuple(positions)
    bad_rows = np.flatnonzero(broken | (per > threshold)) if reason else np.array([], dtype=int)
    bad = positions[int(bad_rows[0])] if bad_rows.size else (positions[0] if reason and positions else None)
    return StageComparison(
        stage, nmse, max_abs, threshold, reason == "", reason, positions, tuple(map(float, per)), bad
    )


def compare_ids(
    stage: str, a: np.ndarray, b: np.ndarray, positions: tuple[int, ...], probs: tuple | None = None
) -> StageComparison:
    """Integer ids (the experts each token is routed to) compared exactly, as a set per position:
    the row's `nmse` is the fraction of ids that differ, `max_abs` the most at one position, and a
    failure names the set difference where it first shows. `probs` (a's and b's router
    probabilities, or logits, at the same positions), when given, excuse a tie: ids that differ only
    where b's scores of the swapped experts are closer than the two runs' own disagreement there."""
    if np.shape(a) != np.shape(b):
        return StageComparison(stage, np.inf, np.inf, 0.0, False, f"shape {np.shape(a)} vs {np.shape(b)}")
    a2, b2 = np.asarray(a).reshape(len(positions), -1), np.asarray(b).reshape(len(positions), -1)
    per, ties, first = [], 0, ""
    for i, (x, y) in enumerate(zip(a2, b2)):
        only_a, only_b = sorted(set(x.tolist()) - set(y.tolist())), sorted(set(y.tolist()) - set(x.tolist()))
        if only_a and probs is not None and _is_tie(probs[0][i], probs[1][i], only_a, only_b):
            ties, only_a = ties + 1, []
        per.append(float(len(only_a)))
        if only_a and not first:
            first = (f"position {positions[i]}: of the {len(x)} experts each run picks, only the first picks "
                     f"{_set(only_a)}, only the second {_set(only_b)}")  # fmt: skip
    n_bad = sum(1 for d in per if d)
    frac = float(sum(per)) / max(a2.size, 1)
    tie_note = f"; {ties} near-tie(s) broken the other way" if ties else ""
    reason = f"top-k differs at {n_bad} of {len(per)} positions; {first}{tie_note}" if n_bad else tie_note[2:]
    bad = next((positions[i] for i, d in enumerate(per) if d), None)
    return StageComparison(stage, frac, max(per, default=0.0), 0.0, not n_bad, reason, positions, tuple(per), bad)


TIE_GAP = 1e-2  # a tie's probabilities differ by at most this, however far apart the runs are


def _is_tie(pa: np.ndarray, pb: np.ndarray, only_a: list[int], only_b: list[int]) -> bool:
    """Whether b's probabilities of the swapped experts lie within the runs' disagreement there
    (and within TIE_GAP: runs that already part upstream do not make every swap a tie)."""
    noise = 2.0 * float(np.max(np.abs(as_f64(pa) - as_f64(pb))))
    gap = float(np.max(as_f64(pb)[only_b])) - float(np.min(as_f64(pb)[only_a]))
    return abs(gap) <= min(noise, TIE_GAP)


def _rows_at(run: Run, name: str, x: np.ndarray, want: tuple[int, ...]) -> np.ndarray:
    """The rows of `run`'s capture `name` that hold the positions `want`."""
    held = run.rows(name)
    if held == want:
        return x
    index = {p: i for i, p in enumerate(held)}
    idx = [index[p] for p in want]
    return x[:, idx] if is_attention_map(name) and x.ndim == 3 else x[idx]


def _heads_at(run: Run, name: str, x: np.ndarray, want: tuple[int, ...]) -> np.ndarray:
    """The heads `want` of `run`'s attention map `name` (a map cut to chosen heads holds fewer)."""
    held = run.heads_held(name)
    return x if held == want else x[[held.index(h) for h in want]]


def _common_heads(a: Run, b: Run, name: str) -> tuple[int, ...] | None:
    """The heads both runs hold of an attention map; None for any other capture."""
    if not (is_attention_map(name) and a.captures[name].ndim == 3 and b.captures[name].ndim == 3):
        return None
    in_b = set(b.heads_held(name))
    return tuple(h for h in a.heads_held(name) if h in in_b)


def _slots_in_order_of(a: Run, b: Run, name: str, pos: tuple[int, ...], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """b's per-expert entries ([T, k, ...]) reordered, token by token, to a's order of the same
    experts: engines may list a token's k experts in different orders (a near-tie, an unsorted
    top-k), and the slots must pair the same expert, not the same rank. An expert only one run chose
    for a token (a near-tie broken the other way, or a wrong id) has nothing to pair with: its entry
    is left out (given a's value), and that token's ffn_topk row reports the difference."""
    ids = name.rsplit(".", 1)[0] + ".ffn_topk"
    if ids not in a.captures or ids not in b.captures:
        return y
    ia, ib = _rows_at(a, ids, a.captures[ids], pos), _rows_at(b, ids, b.captures[ids], pos)
    out = np.array(y, copy=True)
    for t, (xa, xb) in enumerate(zip(ia.tolist(), ib.tolist())):
        if xa == xb:
            continue
        for j, e in enumerate(xa):
            out[t, j] = y[t, xb.index(e)] if e in xb else x[t, j]
    return out


def _router_scores(a: Run, b: Run, ids_name: str, pos: tuple[int, ...]) -> tuple | None:
    """Both runs' router probabilities beside their top-k, at `pos`, where both captured them: the
    probabilities stage (plus the selection bias the top k ranked them with, ERNIE's exp_probs_b), or
    the softmax of the logits where the top k are the logits' (gpt-oss) or the probabilities were not
    captured (a softmax keeps the ranking: a tie in one is one in the other)."""
    for kind in ("ffn_router_probs", "ffn_router"):
        name = ids_name.replace("ffn_topk", kind)
        if name in a.captures and name in b.captures and set(pos) <= set(a.rows(name)) & set(b.rows(name)):
            pa, pb = _rows_at(a, name, a.captures[name], pos), _rows_at(b, name, b.captures[name], pos)
            if kind == "ffn_router":
                pa, pb = _softmax_rows(pa), _softmax_rows(pb)
            bias = _selection_bias(a, b, ids_name)
            return (pa, pb) if bias is None else (as_f64(pa) + bias, as_f64(pb) + bias)
    return None


def _selection_bias(a: Run, b: Run, ids_name: str) -> np.ndarray | None:
    """The bias the top k ranked the probabilities with, from whichever run knows its model."""
    for run in (a, b):
        if run.selection_bias is not None:
            return run.selection_bias(ids_name)
    return None


def _softmax_rows(z: np.ndarray) -> np.ndarray:
    """Logits as probabilities, so that a tie is judged on the same scale (TIE_GAP) either way."""
    e = np.exp(as_f64(z) - np.max(as_f64(z), axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _common_positions(a: Run, b: Run, name: str, sel: slice | None) -> tuple[int, ...]:
    in_b = set(b.rows(name))
    both = [p for p in a.rows(name) if p in in_b]
    return tuple(both[sel] if sel is not None else both)


def _no_common_error(a: Run, b: Run) -> NoCommonStagesError:
    def few(run: Run) -> str:
        names = list(run.captures)[:4]
        return ", ".join(names) + (", ..." if len(run.captures) > 4 else "") if names else "(nothing captured)"

    guess = _guess_preset([*a.captures, *b.captures])
    hint = f"they look like names={guess!r}: " if guess else ""
    return NoCommonStagesError(
        f"the runs have no captured stage in common: {a.engine} has {few(a)}; {b.engine} has {few(b)}. "
        f"Foreign names need mapping onto labkit's stages: {hint}labkit.load_dumps(..., names='llamacpp' | "
        "'hf' | 'transformerlens' | {their name: stage})"
    )


def _guess_preset(names: list[str]) -> str | None:
    """Which engine's names these look like (for the hint only; labkit.dumps does the mapping)."""
    text = " ".join(names)
    for preset, marks in (
        ("transformerlens", ("hook_", "blocks.")),
        ("hf", ("layers.", "lm_head", "embed_tokens")),
        ("llamacpp", ("l_out-", "attn_norm-", "result_", "kq_soft_max-")),
    ):
        if any(m in text for m in marks):
            return preset
    return None


def compare(a: Run, b: Run, thresholds: dict[str, float] | None = None, positions: slice | None = None,
            own: dict[str, tuple[float, float]] | None = None) -> Comparison:  # fmt: skip
    """Compare every stage both runs captured, in the model's graph order.

    thresholds: {stage kind: max NMSE}; by default, per kind the looser of the two runs'
    precisions (labkit.precision). positions: a slice of the positions both runs hold. own: {stage:
    (its own error, the most its precision explains)} as `attribute` computes them (labkit.attribution.verdict):
    a stage over the table whose own error is inside that is not a divergence, and its row says so; a stage
    whose own error leaves it is one, whatever the table says."""
    if thresholds is None:
        th = thresholds_for(a.precision, b.precision)
        used = f"{looser(a.precision, b.precision)} table ({a.engine}: {a.precision}, {b.engine}: {b.precision})"
    else:
        th, used = thresholds, "given by the caller"
    names = graph_sorted([*a.stages, *b.stages, *a.captures, *b.captures])
    common = {n for n in names if n in a.captures and n in b.captures}
    if not common:
        raise _no_common_error(a, b)
    rows, missing = [], []
    agreement = None
    for name in names:
        if name not in common:
            missing.append(name)
            continue
        pos = _common_positions(a, b, name, positions)
        x, y = _rows_at(a, name, a.captures[name], pos), _rows_at(b, name, b.captures[name], pos)
        if stage_kind(name) in SLOT_KINDS:
            y = _slots_in_order_of(a, b, name, pos, x, y)
        heads = _common_heads(a, b, name)
        if heads is not None:
            x, y = _heads_at(a, name, x, heads), _heads_at(b, name, y, heads)
        if stage_kind(name) in ID_KINDS:
            rows.append(compare_ids(name, x, y, pos, _router_scores(a, b, name, pos)))
            continue
        limit = th.get(stage_kind(name), DEFAULT_THRESHOLD)
        rows.append(_inherited(compare_arrays(name, x, y, limit, a.unwritten.get(name, 0), pos), (own or {}).get(name)))
        if name == "logits":
            agreement = logits_agreement(x, y, rows[-1].positions, (a.engine, b.engine))
    return Comparison(a.engine, b.engine, rows, missing, used, a.model, dict(a.variants), dict(b.variants), agreement)


def _inherited(row: StageComparison, own: tuple[float, float] | None) -> StageComparison:
    """A row judged with its stage's own error (`own`: that error, and the most its precision explains there).
    Over the table but inside its band, it passes and says its error came in with its inputs (a clean run's
    error grown through large scores, a quantized cache's rounding); outside its band it fails, under the table
    or not (a fault small enough for the table)."""
    if own is None or row.reason not in ("", "nmse"):
        return row
    local, limit = own
    if local > limit:
        return replace(row, passed=False, reason=f"its own error {local:.1e} leaves its band {limit:.1e}")
    if row.passed:
        return row
    why = f"over the table, inherited: its own error {local:.1e} is inside its band {limit:.1e}"
    return replace(row, passed=True, reason=why, first_bad_position=None)


def _set(ids: list[int]) -> str:
    """A set of ids as a set reads: {3, 7}."""
    return "{" + ", ".join(str(i) for i in ids) + "}"
