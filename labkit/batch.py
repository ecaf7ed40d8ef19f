"""Batches of sequences, as engines serve them: several prompts packed in one pass (`run_batch`), and
decoded together, one token each per step, each on its own cache length (`generate_batch`, continuous
batching). The packing is the engines' (labkit.model.batch_stages): per-token stages once over the
packed rows, the stages that mix a sequence's tokens once per sequence. A sequence's captures are what
its own pass would capture, so a batch compares with one-shot runs stage by stage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit import progress
from labkit.errors import InvalidArgumentError
from labkit.model.cache_stages import CacheTypes
from labkit.model.reference import KVCache
from labkit.sampling import GREEDY, Sampler


@dataclass
class BatchGeneration:
    """Each sequence's new ids and text, and the batch's timings (`decode_s_per_step`: a step of
    every live sequence)."""

    prompt_ids: list[list[int]]
    ids: list[list[int]]
    texts: list[str]
    timings: dict[str, float] = field(default_factory=dict)


def batch_ids(lab: Any, prompts: list, extra: int = 0) -> list[list[int]]:
    """Each prompt's ids (each one, with `extra` new tokens, within the context: PromptTooLongError naming
    it); a batch of none is refused."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise InvalidArgumentError("a batch is a non-empty list of prompts (texts or token id lists)")
    return [lab.prompt_ids(p, extra=extra) for p in prompts]


def check_batch_fits(lab: Any, engine: str, capacities: list[int], names) -> list[str] | None:
    """The batch's memory, planned before any work: every sequence's cache and the packed captures
    (MemoryBudgetError naming the batch when they do not fit); the capture that fits."""
    return lab.fit.capture(engine, sum(capacities), names)


ENGINES = ("gpu", "reference", "llamacpp")  # llamacpp: run_batch only (llama.cpp's own batch, the oracle extra)


def _check_engine(engine: str, allowed: tuple[str, ...], what: str) -> None:
    if engine not in allowed:
        raise InvalidArgumentError(f"{what} engine {engine!r}: use " + " or ".join(repr(e) for e in allowed))


def run_batch(lab: Any, prompts: list, names: list[str] | None, engine: str) -> list:
    """One pass of the batch on `engine`; one Run per sequence."""
    from labkit.selection import select_names

    _check_engine(engine, ENGINES, "run_batch")
    seqs = batch_ids(lab, prompts)
    names = check_batch_fits(lab, engine, [len(s) for s in seqs], select_names(lab.graph, names, None))
    t0 = time.perf_counter()
    if engine == "reference":
        caps = lab.reference_engine.forward_batch(seqs, [KVCache() for _ in seqs], names)
        timings = {"total_s": time.perf_counter() - t0}
    elif engine == "gpu":
        from labkit.gpu.pass_request import BatchState

        ex = lab.executor
        ex.upload_all()
        res = ex.run_batch_pass(seqs, BatchState([ex.new_state(len(s)) for s in seqs]), names)
        caps, timings = res.captures, res.timings
    else:  # llama.cpp's own batch: its sequence ids over one unified cache (the oracle extra)
        from labkit.oracle.llamacpp_run import run_llamacpp_batch

        types = lab.kv_types
        kv = None if types == CacheTypes() else (types.k, types.v)
        caps = run_llamacpp_batch(lab.path, lab.config, lab.graph, seqs, None if names is None else set(names), kv)
        timings = {"total_s": time.perf_counter() - t0}
    path = f"batch={len(seqs)}"
    variants = dict(lab.selected) if engine == "gpu" else {}
    return [lab._make_run(engine, s, c, dict(timings), variants=variants, path=path) for s, c in zip(seqs, caps)]


def generate_batch(lab: Any, prompts: list, max_new_tokens: int, sampler: Sampler | None, engine: str
                   ) -> BatchGeneration:  # fmt: skip
    """Continuous batching: the prompts in one pass, then a step per token for every sequence still
    going (each its own position), until each stops at EOS or after max_new_tokens."""
    _check_engine(engine, ENGINES[:2], "generate_batch")
    if max_new_tokens < 0:
        raise InvalidArgumentError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    seqs = batch_ids(lab, prompts, extra=max_new_tokens)
    capacities = [len(s) + max_new_tokens for s in seqs]
    check_batch_fits(lab, engine, capacities, ["logits"])
    step = _stepper(lab, engine, capacities)
    pick = _picker(lab, engine, sampler or GREEDY)
    out: list[list[int]] = [[] for _ in seqs]
    live = list(range(len(seqs)))
    steps: list[float] = []
    dispatches: list[float] = []
    with progress.bar(max_new_tokens * len(seqs), "generate_batch", unit="tok") as bar:
        t0 = time.perf_counter()
        logits, _ = step(seqs, live)
        t1 = time.perf_counter()
        while live and max_new_tokens:
            for k, row in zip(live, logits):
                out[k].append(pick(row))
            bar.update(len(live))
            live = [k for k in live if out[k][-1] != lab.config.eos_id and len(out[k]) < max_new_tokens]
            if not live:
                break
            s0 = time.perf_counter()
            logits, calls = step([[out[k][-1]] for k in live], live)
            steps.append(time.perf_counter() - s0)
            dispatches.append(calls)
        t2 = time.perf_counter()
    timings = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "steps": len(steps),
               "decode_s_per_step": float(np.median(steps)) if steps else 0.0,
               "dispatches": float(np.median(dispatches)) if dispatches else 0.0,
               "decode_tok_s": sum(max(len(o) - 1, 0) for o in out) / max(t2 - t1, 1e-9)}  # fmt: skip
    return BatchGeneration(seqs, out, [lab.detokenize(o) for o in out], timings)


def _stepper(lab: Any, engine: str, capacities: list[int]):
    """step(new ids of the live sequences, their indices) -> (each one's last logits row, dispatches)."""
    if engine == "reference":
        eng, caches = lab.reference_engine, [KVCache() for _ in capacities]

        def step(ids: list[list[int]], live: list[int]) -> tuple[list[np.ndarray], float]:
            caps = eng.forward_batch(ids, [caches[k] for k in live], ["logits"])
            return [c["logits"][-1] for c in caps], 0

        return step
    from labkit.gpu.pass_request import BatchState

    ex = lab.executor
    ex.upload_all()
    states = [ex.new_state(c) for c in capacities]
    held = {}  # the live sequences -> their BatchState (its compiled step holds while they step together)

    def gpu_step(ids: list[list[int]], live: list[int]) -> tuple[list[np.ndarray], float]:
        batch = held.get(tuple(live))
        if batch is None:
            held.clear()
            batch = held[tuple(live)] = BatchState([states[k] for k in live])
        res = ex.run_batch_pass(ids, batch, ["logits"])
        return [c["logits"][-1] for c in res.captures], res.timings["dispatches"]

    return gpu_step


def _picker(lab: Any, engine: str, sampler: Sampler):
    if engine == "gpu":
        from labkit.gpu.sampling import GpuSampler

        return GpuSampler(lab.executor, sampler)
    return sampler
