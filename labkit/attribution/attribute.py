"""labkit.attribute: each stage's own error, told apart from the error it inherited.

For every stage the run captured whole, the stage (or the segment leading to it from
captured stages) is recomputed from the engine's own inputs twice: exactly, in float64, and
as an engine of the run's precision computes it (labkit.attribution.emulation). Then

- local = nmse(engine's output, exact recomputation): the stage's own error;
- band = nmse(emulated recomputation, exact recomputation): what the precision alone gives;
- inherited = nmse(exact recomputation, reference): what it would show if it were exact;
- total = nmse(engine's output, reference): what `labkit.compare` measures.

A stage is guilty when its local error is more than `k` times its band (never less than
the precision's floor), or when it writes a NaN, an inf or an unwritten element that its
exact recomputation from the same inputs does not have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labkit.attribution.emulation import emulation_for
from labkit.attribution.evaluate import PassContext, evaluate
from labkit.attribution.report import Attribution, StageAttribution
from labkit.attribution.segments import Segment, segment_of
from labkit.captures import Run, graph_sorted, is_attention_map, stage_kind
from labkit.compare import compare_arrays, nmse_of
from labkit.errors import InvalidArgumentError, NoCommonStagesError
from labkit.model.reference import KVCache
from labkit.precision import DEFAULT_THRESHOLD, thresholds_for

# Guilty when local NMSE > K × max(band, FLOOR). Measured on clean runs (docs/attribution.md,
# scripts/measure_attribution.py): the largest local/band over every stage of both models' golden
# prompts is 5.7 (f32), 3.0 (int8-activations), 4.6 (f16) and 8.2 (bf16): K keeps a margin of 2 or more.
GUILT_FACTOR: dict[str, float] = {
    "float64": 10.0,
    "float32": 30.0,
    "float16": 10.0,
    "bfloat16": 20.0,
    "int8-activations": 8.0,
}
# The smallest band a stage is given: an op whose precision changes nothing (an embedding lookup
# of exactly representable values) would otherwise make any rounding of the engine's guilty, and
# an f32 kernel's own algebra differs from a plain sum: labkit's int8-repacked Q4_1 matmul adds a
# per-group offset that cancels, and at SmolLM2's massive activation (2369 at the first position)
# its ffn_down has local NMSE 1.1e-12 where a plain f32 sum gives 1e-15. 2e-13 is a relative
# error of 4.5e-7, about 8 f32 ulps; every fault people debug is 1e-8 or more.
BAND_FLOOR: dict[str, float] = {
    "float64": 1e-24,
    "float32": 2e-13,
    "float16": 1e-8,
    "bfloat16": 1e-6,
    "int8-activations": 1e-8,
}


BAND_ROWS = 64  # positions a large matmul's band is emulated on (see _band)
BAND_SAMPLE_ABOVE = 1 << 24  # output values from which a matmul's band is sampled


def attribute(
    run: Run,
    lab: Any,
    reference: Run | None = None,
    past: Run | None = None,
    k: float | None = None,
) -> Attribution:
    """Local error per stage of `run` (a GPU run, llama.cpp's tensors, another engine's dumps).

    lab: the open Lab of the run's model (its weights and graph). reference: the float64 run
    of the same tokens for the total error (computed when not given). past: for a decode step
    (run.n_past > 0), the same engine's run of the positions before it, whose k_rope and v are
    the cache the step's attention read. k: the multiple of the band past which a stage is guilty
    (default: GUILT_FACTOR for the run's precision)."""
    graph = lab.graph
    T = len(run.tokens)
    available = {n for n in run.captures if n in set(lab.stages) and _whole(run, n, T, lab.config.n_heads)}
    if not available:
        raise NoCommonStagesError(
            f"{run.engine} run holds no stage of {lab.name} with every position and head: nothing to attribute"
        )
    past_cache = _past_cache(run, past, lab)
    ctx = PassContext(lab.reference_engine.weights, graph, np.asarray(run.tokens), run.n_past, past_cache)
    ref = reference if reference is not None else _reference_run(lab, run, past, available)
    emulation = emulation_for(run.precision)
    k = GUILT_FACTOR[run.precision] if k is None else float(k)
    floor = BAND_FLOOR[run.precision]
    fixed = thresholds_for(run.precision, "float64")
    rows, segments = [], {}
    for name in graph_sorted(available):
        seg = segments[name] = segment_of(name, graph, available)
        exact = evaluate(seg, run.captures, ctx)
        band = _band(seg, run, ctx, emulation, exact)
        rows.append(_row(name, seg.stages, run, exact, band, ref, k, floor, fixed))
    return Attribution(run.engine, run.precision, k, floor, rows, run.model, run.n_past, dict(run.variants),
                       _repro=(run, lab, ctx, segments))  # fmt: skip


def _band(seg: Segment, run: Run, ctx: PassContext, emulation, exact: np.ndarray) -> float:
    """NMSE of the stage recomputed as the engine's precision computes it, against exactly. A large
    matmul (Gemma's 262k-wide logits: 134M values at 512 tokens) is emulated on BAND_ROWS evenly
    spread positions only: its rows are independent, and the band's estimate from 64 of them is
    within a few percent, at an eighth of the cost."""
    matmul_only = all(ctx.by_name[s].op == "matmul" for s in seg.stages)
    if not matmul_only or exact.ndim != 2 or exact.size < BAND_SAMPLE_ABOVE or exact.shape[0] <= BAND_ROWS:
        return nmse_of(evaluate(seg, run.captures, ctx, emulation), exact)
    pick = np.unique(np.linspace(0, exact.shape[0] - 1, BAND_ROWS).astype(int))
    inputs = {n: np.asarray(run.captures[n])[pick] for n in seg.inputs}
    return nmse_of(evaluate(seg, inputs, ctx, emulation), exact[pick])


def _row(name, segment, run: Run, exact, band: float, ref: Run, k, floor, fixed) -> StageAttribution:
    out = np.asarray(run.captures[name])  # compared in its own dtype, converted block by block
    limit = k * max(band, floor)
    read_nan = np.isnan(exact)  # NaN computed exactly from the engine's NaN inputs: inherited, not made here
    mine, want = (np.where(read_nan, 0.0, out), np.where(read_nan, 0.0, exact)) if read_nan.any() else (out, exact)
    local = compare_arrays(name, mine, want, limit, run.unwritten.get(name, 0), run.rows(name))
    inherited = nmse_of(exact, ref.captures[name]) if name in ref.captures else np.nan
    total = compare_arrays(name, out, ref.captures[name], fixed.get(stage_kind(name), DEFAULT_THRESHOLD))
    return StageAttribution(
        name, tuple(segment), local.nmse, float(inherited), total.nmse, band, limit, not local.passed,
        "" if local.reason == "nmse" else local.reason, local.first_bad_position, not total.passed,
    )  # fmt: skip


def _whole(run: Run, name: str, T: int, n_heads: int) -> bool:
    """Whether a capture holds every position (and every head of an attention map)."""
    if len(run.rows(name)) != T:
        return False
    return not (is_attention_map(name) and run.captures[name].ndim == 3 and len(run.heads_held(name)) != n_heads)


def _past_cache(run: Run, past: Run | None, lab) -> dict[tuple[int, str], np.ndarray]:
    """(layer, "k"/"v") → the cache of the positions before a decode step, from the engine's past run."""
    if run.n_past == 0:
        return {}
    if past is None or past.n_past != 0 or len(past.tokens) != run.n_past:
        raise InvalidArgumentError(
            f"a decode step (n_past={run.n_past}) reads a KV cache: give past=, the same engine's prompt pass of the "
            f"{run.n_past} positions before it (with its k_rope and v captured)"
        )
    cache = {}
    for st in lab.graph:
        if st.kv_write:
            if st.name not in past.captures:
                raise InvalidArgumentError(f"past run lacks {st.name}, which holds the layer's {st.kv_write} cache")
            cache[(st.layer, st.kv_write)] = np.asarray(past.captures[st.name], np.float64)
    return cache


def _reference_run(lab, run: Run, past: Run | None, names: set[str]) -> Run:
    """The float64 reference of the same positions, capturing the attributed stages."""
    if run.n_past == 0:
        return lab.reference(run.tokens, names=sorted(names))
    cache = KVCache()
    lab.reference_engine.forward(past.tokens, cache, capture=[])
    caps = lab.reference_engine.forward(run.tokens, cache, capture=sorted(names))
    return Run(lab.name, "reference", list(run.tokens), lab.stages, caps, n_past=run.n_past)
