"""labkit: a Jupyter-first lab for LLM inference on WebGPU, one named stage at a time."""

from labkit.attribution import Attribution, attribute, verdict
from labkit.captures import Run, Stats
from labkit.casebook import cases
from labkit.compare import Comparison, compare
from labkit.dumps import load_dumps
from labkit.errors import LabkitError
from labkit.generation import Generation
from labkit.gpu.shader import kernel_source, register_variant
from labkit.lab import Lab, load_run, open
from labkit.model.registry import MODELS
from labkit.model.weights_diff import WeightsDiff, diff_weights
from labkit.sampling import Sampler
from labkit.selection import Capture
from labkit.sequence import SequenceState
from labkit.serving_paths import paths
from labkit.sweeps import reduce_prompt, sweep
from labkit.top_token import TopToken

__all__ = [
    "MODELS",
    "Attribution",
    "Capture",
    "Comparison",
    "Generation",
    "Lab",
    "LabkitError",
    "Run",
    "Sampler",
    "SequenceState",
    "Stats",
    "TopToken",
    "WeightsDiff",
    "attribute",
    "cases",
    "compare",
    "diff_weights",
    "load_dumps",
    "load_run",
    "kernel_source",
    "register_variant",
    "open",
    "paths",
    "reduce_prompt",
    "sweep",
    "verdict",
]
