"""labkit: a Jupyter-first lab for LLM inference on WebGPU, one named stage at a time."""

from labkit import cases
from labkit.captures import Run, Stats, TopToken
from labkit.compare import Comparison, compare
from labkit.errors import LabkitError
from labkit.gpu.variants import kernel_source, register_variant
from labkit.lab import Generation, Lab, open
from labkit.model.registry import MODELS
from labkit.sampling import Sampler

__all__ = [
    "MODELS",
    "Comparison",
    "Generation",
    "Lab",
    "LabkitError",
    "Run",
    "Sampler",
    "Stats",
    "TopToken",
    "cases",
    "compare",
    "kernel_source",
    "register_variant",
    "open",
]
