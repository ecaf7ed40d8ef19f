"""`labkit.sweeps`: prompts x variant selections x models as Dask tasks, one row per pass pair."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.errors import InvalidArgumentError
from labkit.ops.registry import check_selection
from labkit.sweeps.cluster import dask_client
from labkit.sweeps.files import save_results
from labkit.sweeps.task import AGAINST, run_task, selection_label

COLUMNS = ["model", "prompt", "tokens", "n_tokens", "variants", "against", "diverged", "first_divergence",
           "first_divergence_kind", "first_divergence_position", "top1", "top1_against", "top1_agree",
           "pass_s", "against_s", "against_kept", "open_s", "task_s", "worker", "error", "error_type"]  # fmt: skip


def parse_selection(text: str) -> dict[str, str]:
    """`op=name[,op=name]` (one --variant flag) as a selection; "default" or "" for none."""
    if text.strip() in ("", "default"):
        return {}
    out = {}
    for part in text.split(","):
        key, sep, name = part.strip().partition("=")
        if not sep or not key or not name:
            raise InvalidArgumentError(f"--variant wants op=name[,op=name], got {text!r}")
        out[key] = name
    return check_selection(out)


def sweep(
    models: str | Sequence[str],
    prompts: Iterable,
    variants: Sequence[Mapping[str, str]] = ({},),
    against: str = "reference",
    client: Any = None,
    scheduler: str | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    n_workers: int | None = None,
):
    """A pandas DataFrame, one row per (model, prompt, variant selection): first divergence and its
    position, worst NMSE per stage kind (`nmse.<kind>` columns), top-1 agreement, prompt length,
    timings and the worker. A task that raises is a row with `error`.

    Runs on `client` (a distributed.Client), on the scheduler at `scheduler`, or on a
    LocalCluster of one-thread worker processes sized to this machine. Each worker opens a model
    once and keeps its Lab, and the last run it compared against: a prompt's selections are adjacent
    tasks, so a worker makes a prompt's reference about once (`against_kept`). `against`:
    "reference" (float64), "llamacpp", or "default" (the same prompt with no variant). `out`: also
    saved as Parquet, this sweep's configuration in its metadata."""
    import pandas as pd

    models = [models] if isinstance(models, str) else list(models)
    prompts = [p if isinstance(p, str) else [int(i) for i in p] for p in prompts]
    selections = [check_selection(dict(v)) for v in variants]
    if against not in AGAINST:
        raise InvalidArgumentError(f"against must be one of {', '.join(AGAINST)}, not {against!r}")
    if not models or not prompts or not selections:
        raise InvalidArgumentError("a sweep needs at least one model, one prompt and one variant selection")
    tasks = [(m, p, v) for m in models for p in prompts for v in selections]
    t0 = time.perf_counter()
    with dask_client(client, scheduler, n_workers) as c:
        futures = c.map(run_task, *zip(*tasks), [against] * len(tasks), pure=False)
        if progress:
            from distributed import progress as show_progress

            show_progress(futures)
        rows = c.gather(futures)
        workers = sorted(c.scheduler_info()["workers"])
    wall = time.perf_counter() - t0
    df = pd.DataFrame(rows)
    df = df[[c for c in COLUMNS if c in df] + sorted(c for c in df if c not in COLUMNS)]
    config = {
        "models": models,
        "n_prompts": len(prompts),
        "variants": [selection_label(v) for v in selections],
        "against": against,
        "scheduler": scheduler or ("client" if client is not None else "local"),
        "workers": workers,
        "wall_s": wall,
    }
    df.attrs["labkit.sweep"] = config
    if out is not None:
        save_results(df, out, config)
    return df


def throughput(df) -> dict[str, float]:
    """Passes per minute (a pass pair counts as one) and the share of task time spent opening labs."""
    config = df.attrs.get("labkit.sweep", {})
    wall = float(config.get("wall_s", 0.0)) or float(df["task_s"].sum())
    opened = float(df.get("open_s", 0.0).fillna(0.0).sum()) if "open_s" in df else 0.0
    return {
        "tasks": float(len(df)),
        "tasks_per_min": 60.0 * len(df) / wall if wall else 0.0,
        "open_share": opened / float(df["task_s"].sum()) if len(df) else 0.0,
        "workers": float(df["worker"].nunique()),
    }
