"""Sweeps beyond one machine: prompts x variant selections x models as Dask tasks, and the
shortest prompt that still fails (delta debugging).

    df = labkit.sweep(["gemma3-270m"], prompts, variants=[{}, {"rope": "normal_pairs"}])
    red = labkit.reduce_prompt("gemma3-270m", long_prompt, {"matmul_q4_k": "mins_added"})

Modules: task (one pass pair on a worker, its row), cluster (which Dask client), sweep (the
table), reduce (ddmin), files (prompt files, Parquet with the configuration).
"""

from labkit.sweeps.files import load_results, read_prompts, save_results
from labkit.sweeps.reduce import Reduction, reduce_prompt
from labkit.sweeps.sweep import parse_selection, sweep, throughput

__all__ = [
    "Reduction",
    "load_results",
    "parse_selection",
    "read_prompts",
    "reduce_prompt",
    "save_results",
    "sweep",
    "throughput",
]
