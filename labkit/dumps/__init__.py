"""Another engine's intermediate tensors as a labkit Run: sources, names, layouts, the load."""

from labkit.dumps.load import load_dumps
from labkit.dumps.names import PRESETS

__all__ = ["PRESETS", "load_dumps"]
