"""labkit: a Jupyter-first lab for LLM inference on WebGPU, one named stage at a time."""

from labkit import cases as _cases_package  # the package stays importable as `labkit.cases` (sys.modules)
from labkit import sweep as _sweep_package  # noqa: F401 (likewise `labkit.sweep`: the attribute is the function)
from labkit.attribution import Attribution, attribute
from labkit.captures import Run, Stats
from labkit.compare import Comparison, compare
from labkit.dumps import load_dumps
from labkit.errors import LabkitError
from labkit.gpu.shader import kernel_source, register_variant
from labkit.lab import Generation, Lab, load_run, open
from labkit.model.registry import MODELS
from labkit.model.weights_diff import WeightsDiff, diff_weights
from labkit.sampling import Sampler
from labkit.selection import Capture
from labkit.sweep import reduce_prompt, sweep
from labkit.top_token import TopToken


def cases() -> list:
    """The post-mortem cases (labkit.cases.Case), in post-mortem order. The package of the same name
    is imported above, so this attribute is set after it and no later import replaces it."""
    return _cases_package.cases()


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
    "reduce_prompt",
    "sweep",
]
