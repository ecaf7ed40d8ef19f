"""Run: the captured stage outputs of one forward pass, whichever engine produced them.

GPU runs, float64 reference runs and llama.cpp oracle runs are all `Run`s with the
same stage names, so compare and viz code never needs to know where data came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit import runfile
from labkit.errors import InvalidArgumentError, UnknownStageError
from labkit.lens import LogitLens, logit_lens

# The stage kinds of every architecture, in the order a layer computes them, and which are
# attention maps ([heads, q_pos, k_pos]; every other capture is [positions, ...]) or integer
# ids: one table (labkit.model.stage_kinds), re-exported here for the compare and viz code.
from labkit.model.stage_kinds import (  # noqa: F401
    ATTENTION_MAPS,
    ID_KINDS,
    KIND_ORDER,
    SLOT_KINDS,
    TOP_LEVEL_KINDS,
    is_attention_map,
    stage_kind,
)

# the debug-mode poison (labkit.poison, below both the executor and the captures), re-exported
from labkit.poison import POISON_BITS, poison_count  # noqa: F401
from labkit.top_token import TopToken

_KIND_INDEX = {k: i for i, k in enumerate(KIND_ORDER)}

# What a run's engine computes in, when the Run does not say (see labkit.precision).
ENGINE_PRECISION = {"reference": "float64", "llamacpp": "int8-activations"}


def graph_position(name: str) -> tuple[int, int, int] | None:
    """A sort key that puts stage names in graph order (embed, layer 0 … layer N, output_norm,
    logits), or None for a name that is no stage of any architecture."""
    kind = stage_kind(name)
    if kind not in _KIND_INDEX:
        return None
    if name.startswith("blk."):
        layer = name.split(".", 2)[1]
        return (1, int(layer), _KIND_INDEX[kind]) if layer.isdigit() else None
    if kind not in TOP_LEVEL_KINDS:
        return None
    return (0 if kind == "embed" else 2, 0, _KIND_INDEX[kind])


def graph_sorted(names) -> list[str]:
    """Stage names in graph order; names that are no stage keep their order, after the stages."""
    names = list(dict.fromkeys(names))
    known = sorted((n for n in names if graph_position(n) is not None), key=graph_position)
    return known + [n for n in names if graph_position(n) is None]


def as_f64(a: np.ndarray) -> np.ndarray:
    """`a` as float64. A debug run's poison is a signalling NaN: casting it raises the invalid flag
    (a RuntimeWarning), so the cast ignores it; the result holds quiet NaNs."""
    with np.errstate(invalid="ignore"):
        return np.asarray(a, dtype=np.float64)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.where(np.isfinite(z), z, -np.inf)
    e = np.exp(z - z.max())
    return e / e.sum()


@dataclass(frozen=True)
class Stats:
    """Summary of one capture (optionally one position): what a debugger prints first."""

    stage: str
    shape: tuple[int, ...]
    min: float
    max: float
    mean: float
    std: float
    rms: float
    nan: int
    inf: int  # every ±inf, the masked ones included
    unwritten: int
    masked: int = 0  # -inf attention scores: the causal/sliding mask, not a fault (counted in `inf` too)

    def __str__(self) -> str:
        masked = f" masked={self.masked}" if self.masked else ""
        return (
            f"{self.stage} {self.shape}: min={self.min:.4g} max={self.max:.4g} mean={self.mean:.4g} "
            f"std={self.std:.4g} rms={self.rms:.4g} nan={self.nan} inf={self.inf}{masked} unwritten={self.unwritten}"
        )

    def _repr_html_(self) -> str:  # Jupyter: a one-row table, NaN/inf/unwritten counts in red
        return _stats_html(self)


@dataclass
class Run:
    """Captures of one pass. Arrays are [positions, ...]; attention maps are [heads, q_pos, k_pos]."""

    model: str
    engine: str
    tokens: list[int]
    stages: list[str]
    captures: dict[str, np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)
    unwritten: dict[str, int] = field(default_factory=dict)
    variants: dict[str, str] = field(default_factory=dict)
    piece: Callable[[int], str] | None = field(default=None, repr=False)
    # stage name → what it computes (labkit.ops.base.Explanation), for widgets; set by the lab
    explain: Callable[[str], Any] | None = field(default=None, repr=False)
    # hidden [n, d_model] → logits [n, vocab] through the final norm and unembedding (logit lens)
    unembed: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    # ffn_topk stage → the selection-only bias its top k rank with (exp_probs_b), None where there is none:
    # a near-tie is judged on what was ranked (labkit.compare)
    selection_bias: Callable[[str], np.ndarray | None] | None = field(default=None, repr=False)
    n_past: int = 0  # positions before this pass (KV cache) — 0 for a prompt pass
    # "float64", "float32", "float16", "bfloat16" or "int8-activations" (labkit.precision);
    # empty: from the engine (reference float64, llamacpp int8-activations, else float32)
    precision: str = ""
    # stage → the positions (0-based in `tokens`) its rows hold, for a capture that does not hold
    # every position (an engine that computed the last position only); absent: every position
    positions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # attention map → the heads it holds, for a map cut to chosen heads (lab.run(heads=...)); absent: all
    heads: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # names in an imported engine's dumps that match no stage, and why (labkit.dumps)
    unmapped: dict[str, str] = field(default_factory=dict)
    # how the run was computed: "one-shot", or a serving path ("ubatch=7", "prefix=5", "verify=4", joined by ",")
    path: str = "one-shot"

    def __post_init__(self):
        if not self.precision:
            self.precision = ENGINE_PRECISION.get(self.engine, "float32")

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.captures:
            if name in self.stages:
                raise UnknownStageError(
                    f"stage {name!r} was not captured in this run: a names filter left it out, or the selected "
                    "variants do not compute it (a fused attn_ctx variant has no attention scores or probs)"
                )
            raise UnknownStageError(f"unknown stage {name!r}; stages are e.g. {', '.join(self.stages[:6])}, ...")
        return self.captures[name]

    def __contains__(self, name: str) -> bool:
        return name in self.captures

    @property
    def debug(self) -> bool:
        """A debug run: outputs were poisoned before the pass, so unwritten elements can be counted."""
        return bool(self.unwritten)

    def unwritten_count(self, a: np.ndarray) -> int:
        """Elements of `a` (part of a capture of this run) still holding the poison pattern."""
        return poison_count(a) if self.debug else 0

    def rows(self, name: str) -> tuple[int, ...]:
        """The positions the capture's rows hold (query rows of an attention map): those listed in
        `positions`, else the last n of the tokens for a capture of n rows (a pass that kept only
        the last position's logits holds one row)."""
        if name in self.positions:
            return self.positions[name]
        T, a = len(self.tokens), self.captures.get(name)
        n = T if a is None or a.ndim == 0 else a.shape[1 if a.ndim == 3 and is_attention_map(name) else 0]
        return tuple(range(T - n, T)) if n <= T else tuple(range(n))

    def heads_held(self, name: str) -> tuple[int, ...]:
        """The heads an attention map holds, in the order of its first axis."""
        if name in self.heads:
            return self.heads[name]
        return tuple(range(self[name].shape[0]))

    def head(self, name: str, head: int) -> np.ndarray:
        """One head of an attention map, [q_pos, k_pos], by its number in the model (a map cut to
        chosen heads holds only those: another raises UnknownStageError)."""
        held = self.heads_held(name)
        if head not in held:
            raise UnknownStageError(f"{name} holds heads {list(held)} only, not head {head}")
        return self[name][held.index(head)]

    def at(self, name: str, pos: int | None) -> np.ndarray:
        """One position of a capture (the query row of an attention map: [heads, k_pos]), or all of
        it for pos=None. A position the capture does not hold raises UnknownStageError."""
        a = self[name]
        if pos is None:
            return a
        held = self.rows(name)
        p = pos + len(self.tokens) if pos < 0 else pos
        if p not in held:
            raise UnknownStageError(f"{name} holds positions {list(held)} only, not position {pos}")
        i = held.index(p)
        return a[:, i] if a.ndim == 3 and is_attention_map(name) else a[i]

    def save(self, path) -> None:
        """Write the captures and what produced them to one .safetensors file (labkit.load_run
        reads it back bit-exactly)."""
        runfile.save_run(self, path)

    def stats(self, name: str, pos: int | None = None) -> Stats:
        """min/max/mean/std/rms and NaN/inf/unwritten counts, over all values or one position.

        Unwritten elements are counted on debug runs only (a poison pattern needs poisoning first);
        the poison is a NaN payload, so they are in `nan` too. The -inf of masked attention scores
        are in `inf` and, separately, in `masked`."""
        a = self.at(name, pos)
        a64 = as_f64(a)
        finite = a64[np.isfinite(a64)]
        if finite.size == 0:
            finite = np.zeros(1)
        return Stats(
            stage=name if pos is None else f"{name}[pos={pos}]",
            shape=tuple(a.shape),
            min=float(finite.min()),
            max=float(finite.max()),
            mean=float(finite.mean()),
            std=float(finite.std()),
            rms=float(np.sqrt(np.mean(finite**2))),
            nan=int(np.isnan(a64).sum()),
            inf=int(np.isinf(a64).sum()),
            unwritten=int(self.unwritten[name]) if pos is None and name in self.unwritten else self.unwritten_count(a),
            masked=int(np.count_nonzero(np.isneginf(a64))) if stage_kind(name) == "attn_scores" else 0,
        )

    def logits(self, pos: int = -1) -> np.ndarray:
        return as_f64(self.at("logits", pos))

    def probs(self, pos: int = -1) -> np.ndarray:
        return _softmax(self.logits(pos))

    def logit_lens(self, kind: str = "resid_out", positions=None) -> LogitLens:
        """Every layer's `kind` through the final norm and unembedding (labkit.lens.LogitLens)."""
        return logit_lens(self, kind, positions)

    def top(self, k: int = 5, pos: int = -1) -> list[TopToken]:
        """The k highest logits at `pos`: (piece, id, logit, prob), prob from a full-vocab softmax.
        Ties go to the lower id."""
        z = self.logits(pos)
        k = min(k, z.size)
        if k <= 0:
            return []
        p = _softmax(z)
        key = np.nan_to_num(z, nan=-np.inf)
        kth = key[np.argpartition(key, z.size - k)[z.size - k]]  # the k-th largest, found in O(vocab)
        ids = np.flatnonzero(key >= kth)  # the top k and any tie at the k-th value, in id order
        ids = ids[np.argsort(-key[ids], kind="stable")][:k]
        piece = self.piece or str
        return [TopToken(piece(int(i)), int(i), float(z[i]), float(p[i])) for i in ids]

    def __repr__(self) -> str:
        return (
            f"Run(model={self.model!r}, engine={self.engine!r}, tokens={self.tokens}, "
            f"stages={len(self.stages)}, captured={len(self.captures)})"
        )

    def _repr_html_(self) -> str:
        """Jupyter: model, engine, the tokens as pieces, top-5 next tokens, stages with NaN/inf/unwritten."""
        return _run_html(self)


# ----- rich display in Jupyter (presentation only: nothing above depends on it)

_CSS = "font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;line-height:1.4"
_TD = "padding:1px 8px;text-align:right"
_BAD = "color:#c00;font-weight:bold"


def _esc(text: object) -> str:
    import html

    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    return f"{x:.4g}"


def _token_chips(run: Run) -> str:
    piece = run.piece or str
    chips = []
    for i, t in enumerate(run.tokens):
        p = piece(int(t))
        chips.append(
            f"<span title='position {i + run.n_past} · id {t}' style='display:inline-block;white-space:pre;"
            "margin:1px;padding:0 3px;border:1px solid #bbb;border-radius:3px;background:rgba(76,114,176,.12);"
            f"font-family:var(--jp-code-font-family,monospace)'>{_esc(p)}</span>"
        )
    return "".join(chips)


def _flagged_stages(run: Run) -> list[tuple[str, int, int, int]]:
    """(stage, nan, inf, unwritten) of every captured stage with any of them. Masked attention
    scores are -inf by design: they are not counted as inf."""
    out = []
    for name in run.stages:
        if name not in run.captures:
            continue
        s = run.stats(name)
        if s.nan or s.inf - s.masked or s.unwritten:
            out.append((name, s.nan, s.inf - s.masked, s.unwritten))
    return out


def _top_html(run: Run, k: int = 5) -> str:
    if "logits" not in run.captures:
        return "<div style='color:#888'>no logits captured: no next-token ranking</div>"
    rows = []
    for t in run.top(k):
        bar = max(1, round(t.prob * 120))
        rows.append(
            f"<tr><td style='{_TD};text-align:left;white-space:pre;font-family:var(--jp-code-font-family,monospace)'>"
            f"{_esc(repr(t.piece))}</td><td style='{_TD}'>{t.id}</td><td style='{_TD}'>{t.logit:.3f}</td>"
            f"<td style='{_TD}'>{t.prob:.3f}</td><td style='padding:1px 4px;text-align:left'>"
            f"<div style='width:{bar}px;height:9px;background:#55a868'></div></td></tr>"
        )
    head = "".join(f"<th style='{_TD}'>{h}</th>" for h in ("piece", "id", "logit", "prob", ""))
    return f"<table style='border-collapse:collapse'><tr>{head}</tr>{''.join(rows)}</table>"


def _flags_html(run: Run, limit: int = 8) -> str:
    flagged = _flagged_stages(run)
    if not flagged:
        note = " (debug run: every element written)" if run.debug else ""
        return f"<div style='color:#2a7'>✓ no NaN, inf or unwritten element in any stage{note}</div>"
    rows = "".join(
        f"<tr><td style='{_TD};text-align:left'><code>{_esc(s)}</code></td>"
        + "".join(f"<td style='{_TD};{_BAD if v else ''}'>{v}</td>" for v in (nan, inf, unw))
        + "</tr>"
        for s, nan, inf, unw in flagged[:limit]
    )
    more = f"<div>… and {len(flagged) - limit} more stages</div>" if len(flagged) > limit else ""
    head = "".join(f"<th style='{_TD}'>{h}</th>" for h in ("stage", "nan", "inf", "unwritten"))
    return (
        f"<div style='{_BAD}'>⚠ {len(flagged)} stage(s) with NaN, inf or unwritten elements; "
        f"first: <code>{_esc(flagged[0][0])}</code></div>"
        f"<table style='border-collapse:collapse'><tr>{head}</tr>{rows}</table>{more}"
    )


def _run_html(run: Run) -> str:
    facts = [
        f"<b>{_esc(run.model)}</b>",
        f"engine <b>{_esc(run.engine)}</b>",
        f"{len(run.tokens)} tokens" + (f" after {run.n_past} cached" if run.n_past else ""),
        f"{len(run.captures)}/{len(run.stages)} stages captured",
    ]
    if "total_s" in run.timings:
        facts.append(f"{run.timings['total_s']:.2f} s")
    if run.timings.get("recomputed_from"):
        facts.append(f"recomputed from <code>{_esc(run.timings['recomputed_from'])}</code>")
    chosen = {f: n for f, n in run.variants.items() if n != "default"}
    if chosen:
        facts.append("variants " + ", ".join(f"<code>{_esc(f)}={_esc(n)}</code>" for f, n in chosen.items()))
    if run.debug:
        facts.append("debug (poisoned)")
    return (
        f"<div class='labkit-run' style='{_CSS}'>"
        f"<div>Run · {' · '.join(facts)}</div>"
        f"<div style='margin:4px 0'>{_token_chips(run)}</div>"
        "<div style='display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap'>"
        f"<div><div style='color:#666'>next token (position {len(run.tokens) - 1 + run.n_past})</div>"
        f"{_top_html(run)}</div><div>{_flags_html(run)}</div></div></div>"
    )


def _stats_html(s: Stats) -> str:
    cells = [("shape", "×".join(map(str, s.shape)) or "()")]
    cells += [(k, _num(getattr(s, k))) for k in ("min", "max", "mean", "std", "rms")]
    cells += [(k, str(getattr(s, k))) for k in ("nan", "inf", "unwritten")]
    head = "".join(f"<th style='{_TD}'>{k}</th>" for k, _ in cells)
    body = "".join(
        f"<td style='{_TD};{_BAD if k in ('nan', 'inf', 'unwritten') and v != '0' else ''}'>{v}</td>" for k, v in cells
    )
    return (
        f"<div class='labkit-stats' style='{_CSS}'><code>{_esc(s.stage)}</code>"
        f"<table style='border-collapse:collapse'><tr>{head}</tr><tr>{body}</tr></table></div>"
    )


def load_run(path, piece: Callable[[int], str] | None = None) -> Run:
    """The Run saved at `path` (labkit.runfile checks every field); `piece` turns its token ids into
    text, given by whoever loads it (`labkit.load_run` opens the run's model for that)."""
    return Run(**runfile.read_run(path), piece=piece)


def routing_of(run: Run | None, graph: list) -> dict[int, np.ndarray] | None:
    """{layer: ids [T, k]} of a run's `ffn_topk` captures, for teacher-forced routing."""
    if run is None:
        return None
    routed = {st.layer: np.asarray(run[st.name]) for st in graph if st.kind == "ffn_topk" and st.name in run.captures}
    if not routed:
        raise InvalidArgumentError(f"route_as: the {run.engine} run captured no ffn_topk stage to route by")
    return routed
