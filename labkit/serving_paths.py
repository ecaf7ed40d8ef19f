"""One prompt through the paths engines serve it by, each against the one-shot pass, stage by stage.

`paths(lab, prompt, ["ubatch=7", "prefix=5", "verify=4"])` runs each path on each engine (the GPU,
the float64 reference, and llama.cpp computing the same path where asked) and asks two questions per
stage. Against the same engine's one-shot pass: is it bitwise equal (batch
invariance: vLLM's batch-invariant mode tests exactly this), and if not, by how much? And is the path
inside the band it explains: a reference path must equal the one-shot reference to 1e-12 (it is the
same arithmetic in float64), a GPU path must pass `compare` against the one-shot reference (the f32
band). A fault that only a path exposes (post-mortem sky-kaw's decode-only mask, a chunk's positions
restarting) shows as that path's first divergence while the one-shot pass shows nothing."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from labkit.captures import Run, is_attention_map, stage_kind
from labkit.compare import compare
from labkit.errors import InvalidArgumentError
from labkit.model.stage_kinds import layout_of
from labkit.quant.cache_types import check_kv_type

PATH_FORMS = ("ubatch=N", "prefix=N", "verify=N", "batch=N", "kv=TYPE")
ENGINES = ("gpu", "reference", "llamacpp")  # llamacpp: its own micro-batches and kept prefix (the oracle extra)
EXACT = 1e-12  # a reference path's largest relative difference from the one-shot reference


@dataclass(frozen=True)
class StageDifference:
    """One stage of a path's run against the same engine's one-shot pass."""

    stage: str
    bitwise: bool
    max_abs: float
    nmse: float
    inputs_bitwise: bool = False  # its inputs (and the caches it read) were: a difference is then its own


@dataclass
class PathCheck:
    """One path on one engine."""

    path: str
    engine: str
    first_difference: str | None  # the first stage not bitwise equal to the engine's one-shot pass
    first_divergence: str | None  # the first stage outside the path's band
    worst_stage: str | None
    worst_nmse: float
    stages: list[StageDifference] = field(default_factory=list)
    # a GPU path against llama.cpp computing the same path: its first divergence ("" where llama.cpp did not run)
    against_llamacpp: str | None = ""

    @property
    def in_band(self) -> bool:
        return self.first_divergence is None


@dataclass
class PathsReport:
    """Every path's checks, and the one-shot passes they were held against."""

    model: str
    tokens: list[int]
    checks: list[PathCheck]

    def table(self) -> str:
        lines = [f"{self.model}, {len(self.tokens)} tokens: each path against the one-shot pass"]
        lines.append(f"{'path':12} {'engine':9} {'bitwise to':26} {'worst NMSE':>10}  verdict")
        for c in self.checks:
            same = "every stage" if c.first_difference is None else f"until {c.first_difference}"
            band = {"reference": "exact (1e-12)", "gpu": "f32 band", "llamacpp": "int8 band"}[c.engine]
            if c.path.startswith("kv="):  # a cache type: each stage's own error against its band (verdict)
                band = "cache's rounding (it defines it)" if c.engine == "reference" else "stages' own bands"
            verdict = f"inside the {band}" if c.in_band else f"departs at {c.first_divergence}"
            if c.against_llamacpp != "":
                verdict += "; as llama.cpp's same path" if c.against_llamacpp is None else (
                    f"; departs from llama.cpp's same path at {c.against_llamacpp}")  # fmt: skip
            lines.append(f"{c.path:12} {c.engine:9} {same:26} {c.worst_nmse:10.2e}  {verdict}")
        lines.append(self.invariance())
        return "\n".join(lines)

    def invariance(self) -> str:
        """Per stage kind, on the GPU: does its kernel give the one-shot pass's bits when its inputs are
        the one-shot pass's bits? A stage whose input already differs says nothing about its kernel."""
        own: dict[str, dict[str, float]] = {}
        judged: list[str] = []
        for c in (c for c in self.checks if c.engine == "gpu"):
            for s in c.stages:
                if s.inputs_bitwise:
                    judged.append(stage_kind(s.stage))
                    if not s.bitwise:
                        worst = own.setdefault(stage_kind(s.stage), {})
                        worst[c.path] = max(worst.get(c.path, 0.0), s.max_abs)
        same = [k for k in dict.fromkeys(judged) if k not in own]
        lines = [
            "batch invariance on the GPU (a kernel's output bitwise equal to the one-shot pass's, its inputs being so):"
        ]
        lines.append(f"  invariant: {', '.join(same) or 'none'}")
        for kind, where in own.items():
            lines.append(f"  {kind}: differs on " + ", ".join(f"{p} (max |d| {d:.1e})" for p, d in where.items()))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "tokens": self.tokens,
                "checks": [asdict(c) | {"in_band": c.in_band} for c in self.checks]}  # fmt: skip


def parse_path(spec: str) -> tuple[str, int | str]:
    """("ubatch" | "prefix" | "verify" | "batch", N) from "ubatch=7", ("kv", type) from "kv=q8_0"; an
    InvalidArgumentError names the forms."""
    kv = re.fullmatch(r"\s*kv\s*=\s*(\w+)\s*", str(spec))
    if kv:
        return "kv", check_kv_type(kv.group(1), "kv")
    m = re.fullmatch(r"\s*(ubatch|prefix|verify|batch)\s*=\s*([0-9]+)\s*", str(spec))
    if not m or int(m.group(2)) < 1:
        raise InvalidArgumentError(f"unknown path {spec!r}: give one of {', '.join(PATH_FORMS)} (N >= 1)")
    return m.group(1), int(m.group(2))


def paths(lab: Any, prompt: Any, paths: list[str] | tuple[str, ...] = ("ubatch=7", "prefix=5", "verify=4"),
          engines: tuple[str, ...] = ("gpu", "reference")) -> PathsReport:  # fmt: skip
    """Each path of `paths` on each engine, against the one-shot passes of the same prompt."""
    ids = lab.prompt_ids(prompt)
    parsed = [(spec.strip(), *parse_path(spec)) for spec in paths]
    if not parsed:
        raise InvalidArgumentError(f"no path given: give some of {', '.join(PATH_FORMS)}")
    for spec, kind, n in parsed:
        if kind in ("prefix", "verify") and n >= len(ids):
            raise InvalidArgumentError(f"{spec}: the prompt has {len(ids)} tokens; the path needs more than {n}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise InvalidArgumentError(f"engines {unknown}: give some of {', '.join(ENGINES)}")
    ref = lab.reference(ids)
    one_shot = {"reference": ref} | {e: _path_run(lab, ids, "one-shot", 0, e) for e in engines if e != "reference"}
    checks = []
    for spec, kind, n in parsed:
        on = lab.with_kv_type(n) if kind == "kv" else lab  # a cache type: the same model on that cache
        runs = {engine: _path_run(on, ids, kind, n, engine) for engine in engines}
        # a cache type's reference (what its GPU and llama.cpp runs are judged against), computed once
        on_ref = (runs.get("reference") or on.reference(ids)) if kind == "kv" and set(runs) - {"reference"} else None
        for engine, run in runs.items():
            start = len(ids) - len(run.tokens)
            if kind == "kv":
                check = _cache_check(spec, engine, run, one_shot[engine], on, on_ref)
            else:
                check = _check(spec, engine, run, _tail(one_shot[engine], start), _tail(ref, start), lab.graph, start)
            if engine == "gpu" and "llamacpp" in runs:
                check.against_llamacpp = compare(run, runs["llamacpp"]).first_divergence
            checks.append(check)
    return PathsReport(lab.name, ids, checks)


def _path_run(lab: Any, ids: list[int], kind: str, n: int, engine: str) -> Run:
    """The prompt through one path on one engine (llama.cpp's own ubatches, kept prefix and batch for "llamacpp")."""
    if kind == "batch":  # the prompt last, after n - 1 others, so its rows sit past theirs
        return lab.run_batch([*batch_companions(ids, n), ids], engine=engine)[-1]
    if engine == "llamacpp":
        prefix = {"prefix": n, "verify": len(ids) - n}[kind] if kind in ("prefix", "verify") else 0
        run = lab.oracle(ids, ubatch=n if kind == "ubatch" else None, prefix=prefix)
        if kind in ("verify", "kv"):
            run.path = f"{kind}={n}"
        return run
    go = lab.run if engine == "gpu" else lab.reference
    if kind == "one-shot":
        return go(ids)
    if kind == "kv":  # `lab` is the model on that cache (Lab.with_kv_type)
        run = go(ids)
        run.path = f"kv={n}"
        return run
    if kind == "ubatch":
        return go(ids, ubatch=n)
    if kind == "batch":  # the prompt last, after n - 1 others, so its rows sit past theirs
        return lab.run_batch([*batch_companions(ids, n), ids], engine=engine)[-1]
    if kind == "prefix":
        return go(ids[n:], state=lab.prefill(ids[:n], engine=engine))
    return lab.verify(ids[-n:], state=lab.prefill(ids[:-n], engine=engine))


def batch_companions(ids: list[int], n: int) -> list[list[int]]:
    """The n - 1 sequences a `batch=n` path packs before the prompt: its tokens reversed, each one token
    shorter than the one before (other tokens, other lengths, at least one token each)."""
    back = list(reversed(ids))
    return [back[: max(1, len(ids) - k)] for k in range(1, n)]


def _check(spec: str, engine: str, run: Run, same_engine: Run, reference: Run, graph: list, start: int) -> PathCheck:
    stages = [_difference(name, run[name], same_engine[name]) for name in same_engine.captures if name in run.captures]
    stages = _with_inputs(stages, graph, prefilled=start > 0)
    if engine == "reference":
        off = [s.stage for s in stages if s.max_abs > EXACT * max(_scale(same_engine[s.stage]), 1e-300)]
        divergence = off[0] if off else None
    else:
        divergence = compare(run, reference).first_divergence
    return _path_check(spec, engine, stages, divergence)


def _cache_check(spec: str, engine: str, run: Run, one_shot: Run, on: Any, on_ref: Run | None) -> PathCheck:
    """A cache type's path: its stages against the same engine's one-shot pass on f32 caches (what the type
    costs, stage by stage), and inside its band when no stage's own error leaves it (labkit.attribution.verdict,
    against `on_ref`, the reference on the same cache). The reference on that cache defines the path."""
    from labkit.attribution.verdict import verdict

    stages = [_difference(n, run[n], one_shot[n]) for n in one_shot.captures if n in run.captures]
    divergence = None if engine == "reference" else verdict(run, on, reference=on_ref).first_divergence
    return _path_check(spec, engine, stages, divergence)


def _path_check(spec: str, engine: str, stages: list[StageDifference], divergence: str | None) -> PathCheck:
    """A path's check from its stage differences: the first that is not bitwise, and the worst."""
    first_diff = next((s.stage for s in stages if not s.bitwise), None)
    worst = max(stages, key=lambda s: s.nmse, default=None)
    return PathCheck(spec, engine, first_diff, divergence, worst.stage if worst else None,
                     worst.nmse if worst else 0.0, stages)  # fmt: skip


def _difference(name: str, a: np.ndarray, b: np.ndarray) -> StageDifference:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape:
        return StageDifference(name, False, float("inf"), float("inf"))
    finite = np.isfinite(x) & np.isfinite(y)
    same_mask = np.array_equal(np.isfinite(x), np.isfinite(y)) and np.array_equal(
        x[~finite], y[~finite], equal_nan=True
    )
    bitwise = same_mask and np.array_equal(np.asarray(a)[finite], np.asarray(b)[finite])
    diff = np.abs(x[finite] - y[finite])
    den = float(np.sum(y[finite] ** 2))
    nmse = float(np.sum(diff**2) / den) if den > 0 else float(np.sum(diff**2))
    return StageDifference(name, bool(bitwise), float(diff.max(initial=0.0)) if same_mask else float("inf"), nmse)


def _with_inputs(stages: list[StageDifference], graph: list, prefilled: bool) -> list[StageDifference]:
    """Each stage marked with whether every input it read was bitwise equal: its input stages, and for
    attention the stages that wrote the caches it read (this layer's k_rope and v). After a prefix
    (`prefilled`) a stage reading a cache or a recurrent state read what the prefix pass wrote, which
    nothing compared: it is not judged."""
    same = {s.stage: s.bitwise for s in stages}
    by_name = {st.name: st for st in graph}
    writers = {(st.layer, st.kv_write): st.name for st in graph if st.kv_write}
    out = []
    for s in stages:
        st = by_name.get(s.stage)
        unseen = st is None or (prefilled and (st.kv_read or getattr(st, "state", None)))
        reads = [""] if unseen else [*st.inputs, *(writers.get((st.layer, kind), "") for kind in st.kv_read)]
        out.append(StageDifference(s.stage, s.bitwise, s.max_abs, s.nmse, all(same.get(r, False) for r in reads)))
    return out


def _scale(a: np.ndarray) -> float:
    x = np.asarray(a, np.float64)
    finite = np.isfinite(x)
    return float(np.abs(x[finite]).max()) if finite.any() else 0.0


def _tail(run: Run, start: int) -> Run:
    """The one-shot run from position `start` on, as a run of those tokens after `start` cached ones:
    rows (query rows of an attention map) sliced, a recurrent state kept whole (it is the state after
    the whole prompt either way)."""
    if start == 0:
        return run
    caps = {}
    for name, a in run.captures.items():
        if layout_of(stage_kind(name)) == "state":
            caps[name] = a
        else:
            caps[name] = a[:, start:] if is_attention_map(name) else a[start:]
    return Run(model=run.model, engine=run.engine, tokens=run.tokens[start:], stages=run.stages, captures=caps,
               variants=run.variants, piece=run.piece, n_past=start, precision=run.precision)  # fmt: skip
