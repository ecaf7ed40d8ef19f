"""Per-stage comparison of two runs, in the manner of ggml's test-backend-ops.

nmse = Σ(a−b)² / Σb² over finite values, with a threshold per stage kind; any NaN
in `a`, any inf mismatch, or any unwritten element fails the stage outright. The
first failing stage in graph order is `first_divergence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from labkit.captures import Run, as_f64, is_attention_map, stage_kind  # stage_kind re-exported

# Stage kind → max NMSE against the float64 reference for an f32 GPU pass.
# Elementwise ops are tight; matmuls carry f32 accumulation over K and the
# upstream error of the whole chain, so they get test-backend-ops' mul_mat bound.
REFERENCE_THRESHOLDS: dict[str, float] = {
    "embed": 1e-10,
    "attn_norm": 1e-6,
    "q": 5e-4,
    "k": 5e-4,
    "v": 5e-4,
    "q_norm": 1e-5,
    "k_norm": 1e-5,
    "q_rope": 1e-5,
    "k_rope": 1e-5,
    "attn_scores": 1e-5,
    "attn_probs": 1e-5,
    "attn_ctx": 1e-5,
    "attn_out": 5e-4,
    "post_attn_norm": 1e-5,
    "resid_mid": 1e-6,
    "ffn_norm": 1e-6,
    "ffn_gate": 5e-4,
    "ffn_up": 5e-4,
    "ffn_act": 1e-5,
    "ffn_down": 5e-4,
    "post_ffn_norm": 1e-5,
    "resid_out": 1e-6,
    "output_norm": 1e-6,
    "logits_raw": 5e-4,  # gemma2: the unembedding before the final soft-cap
    "logits": 5e-4,
}
DEFAULT_THRESHOLD = 1e-6


@dataclass(frozen=True)
class StageComparison:
    stage: str
    nmse: float
    max_abs: float
    threshold: float
    passed: bool
    reason: str = ""  # why it failed when it is not the NMSE (nan, inf mismatch, unwritten, shape)


@dataclass
class Comparison:
    """Per-stage rows in graph order; `missing` lists stages one side lacks."""

    a_engine: str
    b_engine: str
    rows: list[StageComparison]
    missing: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every compared stage passed, and at least one stage was compared."""
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def first_divergence(self) -> str | None:
        return next((r.stage for r in self.rows if not r.passed), None)

    def row(self, stage: str) -> StageComparison:
        return next(r for r in self.rows if r.stage == stage)

    def table(self, only_failed: bool = False) -> str:
        head = f"{'stage':28} {'nmse':>10} {'thresh':>8} {'max|a-b|':>10}  result"
        lines = [f"{self.a_engine} vs {self.b_engine}", head]
        for r in self.rows:
            if only_failed and r.passed:
                continue
            mark = "ok" if r.passed else "FAIL " + r.reason
            lines.append(f"{r.stage:28} {r.nmse:10.3e} {r.threshold:8.0e} {r.max_abs:10.3e}  {mark}")
        if not self.rows:
            lines.append("no stage compared: the runs have no captured stage in common")
        if self.missing:
            lines.append("not compared: " + ", ".join(self.missing))
        lines.append(f"first divergence: {self.first_divergence}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr style='color:{'inherit' if r.passed else '#c00'}'><td>{r.stage}</td><td>{r.nmse:.3e}</td>"
            f"<td>{r.threshold:.0e}</td><td>{r.max_abs:.3e}</td>"
            f"<td>{'ok' if r.passed else 'FAIL ' + r.reason}</td></tr>"
            for r in self.rows
        )
        missing = f"<p>not compared: {', '.join(self.missing)}</p>" if self.missing else ""
        return (
            f"<b>{self.a_engine} vs {self.b_engine}</b>: first divergence <code>{self.first_divergence}</code>"
            f"<table><tr><th>stage</th><th>nmse</th><th>thresh</th><th>max|a-b|</th><th></th></tr>{rows}</table>"
            f"{missing}"
        )

    def to_dict(self) -> dict:
        return {
            "a": self.a_engine,
            "b": self.b_engine,
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "missing": self.missing,
            "stages": [r.__dict__ for r in self.rows],
        }


def compare_arrays(stage: str, a: np.ndarray, b: np.ndarray, threshold: float, unwritten: int = 0) -> StageComparison:
    a, b = as_f64(a), as_f64(b)  # a debug run's poison is a signalling NaN: as_f64 casts it quietly
    if a.shape != b.shape:
        return StageComparison(stage, np.inf, np.inf, threshold, False, f"shape {a.shape} vs {b.shape}")
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    diff = a[both] - b[both]
    denom = float(np.sum(b[both] ** 2))
    nmse = float(np.sum(diff**2) / denom) if denom > 0 else float(np.sum(diff**2))
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    reason = ""
    if unwritten:
        reason = f"{unwritten} unwritten"
    elif np.isnan(a).any():
        reason = f"{int(np.isnan(a).sum())} NaN"
    elif not np.array_equal(np.isinf(a) & (a > 0), np.isinf(b) & (b > 0)) or not np.array_equal(
        np.isinf(a) & (a < 0), np.isinf(b) & (b < 0)
    ):
        reason = "inf mismatch"
    elif not nmse <= threshold:
        reason = "nmse"
    return StageComparison(stage, nmse, max_abs, threshold, reason == "", reason)


def compare(a: Run, b: Run, thresholds: dict[str, float] | None = None, positions: slice | None = None) -> Comparison:
    """Compare every stage both runs captured, in `a`'s stage order."""
    th = REFERENCE_THRESHOLDS if thresholds is None else thresholds
    rows, missing = [], []
    for name in a.stages:
        if name not in a.captures or name not in b.captures:
            missing.append(name)
            continue
        x, y = a.captures[name], b.captures[name]
        if positions is not None:
            x, y = _positions(name, x, positions), _positions(name, y, positions)
        rows.append(compare_arrays(name, x, y, th.get(stage_kind(name), DEFAULT_THRESHOLD), a.unwritten.get(name, 0)))
    return Comparison(a.engine, b.engine, rows, missing)


def _positions(name: str, x: np.ndarray, sel: slice) -> np.ndarray:
    return x[:, sel] if is_attention_map(name) else x[sel]
