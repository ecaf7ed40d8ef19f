"""One sweep task on a worker: a pass pair (the GPU pass under a variant selection, and what it is
compared against), as one row. Each worker process keeps one Lab per model for its lifetime.

Runs in Dask worker processes (one thread each: a WebGPU device stays with its process), or in
this process for a sweep without a cluster. Nothing here knows about Dask but `worker_name`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, NamedTuple

from labkit import progress
from labkit.captures import Run, stage_kind
from labkit.compare import compare
from labkit.lab import Lab
from labkit.lab import open as open_lab

AGAINST = ("reference", "llamacpp", "default")
_LABS: dict[str, Lab] = {}  # this process's labs, by model: opened once per worker, not per task
# the last run this process compared against, by (lab, token ids, against): one entry, never more
_KEPT: dict[tuple[Lab, tuple[int, ...], str], Run] = {}


def worker_lab(model: str) -> tuple[Lab, float]:
    """(the worker's lab for `model`, seconds spent opening it now: 0 when it was open)."""
    if model in _LABS:
        return _LABS[model], 0.0
    t0 = time.perf_counter()
    lab = open_lab(model)
    _LABS[model] = lab
    return lab, time.perf_counter() - t0


def worker_name() -> str:
    """The Dask worker's address, or this process's pid outside a worker."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid:{os.getpid()}"


def selection_label(variants: dict[str, str]) -> str:
    """`rope=normal_pairs,softmax=no_max_sub`, or `default` for no variant."""
    return ",".join(f"{k}={v}" for k, v in sorted(variants.items())) or "default"


def select(lab: Lab, variants: dict[str, str]) -> None:
    """Exactly this selection on the lab (a worker's lab served the previous task's)."""
    for key in list(lab.selected):
        lab.use(key, "default")
    for key, name in variants.items():
        lab.use(key, name)


class PassPair(NamedTuple):
    """A task's two runs and their seconds; `against_kept`: the compared run was the worker's last
    task's (the same prompt), not made again."""

    run: Run
    other: Run
    pass_s: float
    against_s: float
    against_kept: bool = False


def pass_pair(lab: Lab, prompt, variants: dict[str, str], against: str) -> PassPair:
    """The run under the variants and the run it is compared with."""
    if against == "default":  # the same prompt with no variant; the switch re-runs only what it affects
        select(lab, {})
        t0 = time.perf_counter()
        other = lab.run(prompt, timestamps=False)
        t1 = time.perf_counter()
        select(lab, variants)
        run = lab.run(prompt, timestamps=False)
        return PassPair(run, other, time.perf_counter() - t1, t1 - t0)
    select(lab, variants)
    t0 = time.perf_counter()
    lab.forget_last_pass()
    run = lab.run(prompt, timestamps=False)
    t1 = time.perf_counter()
    other, kept = against_run(lab, prompt, against)
    return PassPair(run, other, t1 - t0, time.perf_counter() - t1, kept)


def against_run(lab: Lab, prompt, against: str) -> tuple[Run, bool]:
    """(the reference pass or llama.cpp's tensors of a prompt, whether it was kept): kept for the
    worker's next task, as a sweep's selections of one prompt are adjacent tasks and no variant
    changes either run. One run is kept, so a worker holds at most the two runs its compare holds."""
    key = (lab, tuple(lab.prompt_ids(prompt)), against)  # a Lab hashes by identity
    if key in _KEPT:
        return _KEPT[key], True
    _KEPT.clear()  # before the new run is made: never two kept
    _KEPT[key] = lab.reference(prompt) if against == "reference" else lab.oracle(prompt)
    return _KEPT[key], False


def run_task(model: str, prompt, variants: dict[str, str], against: str) -> dict[str, Any]:
    """One row: first divergence (stage, kind, position), worst NMSE per stage kind, top-1 agreement,
    timings and the worker; a task that raises is a row with its error, never a lost sweep."""
    text = prompt if isinstance(prompt, str) else None  # token-id prompts have no text
    row: dict[str, Any] = {"model": model, "prompt": text, "variants": selection_label(variants), "against": against}
    row.update(tokens=None if text is not None else [int(i) for i in prompt], worker=worker_name())
    if not row["worker"].startswith("pid:") and multiprocessing.parent_process() is not None:
        progress.set_enabled(False)  # a worker process's bars would cut through the sweep's own
    t0 = time.perf_counter()
    try:
        lab, row["open_s"] = worker_lab(model)
        row["tokens"] = lab.prompt_ids(prompt)
        row["n_tokens"] = len(row["tokens"])
        run, other, row["pass_s"], row["against_s"], row["against_kept"] = pass_pair(lab, prompt, variants, against)
        row.update(divergence_fields(compare(run, other)))
        mine, theirs = run.top(1)[0], other.top(1)[0]
        row.update(top1=mine.piece, top1_against=theirs.piece, top1_agree=mine.id == theirs.id)
    except Exception as e:  # noqa: BLE001 (a task's failure is data: the sweep goes on)
        row.update(error=f"{type(e).__name__}: {e}", error_type=type(e).__name__)
    row["task_s"] = time.perf_counter() - t0
    return row


def divergence_fields(cmp) -> dict[str, Any]:
    """first divergence (stage, kind, position) and the worst NMSE of each stage kind."""
    first = cmp.first_divergence
    worst: dict[str, float] = {}
    for r in cmp.rows:
        kind = stage_kind(r.stage)
        worst[kind] = max(worst.get(kind, 0.0), float(r.nmse))
    return {
        "diverged": first is not None,
        "first_divergence": first,
        "first_divergence_kind": stage_kind(first) if first else None,
        "first_divergence_position": cmp.first_divergence_position,
        **{f"nmse.{k}": v for k, v in worst.items()},
    }
