"""Reading one GGUF metadata value as a hyperparameter: present (or its default), of a sane range,
finite; a count llama.cpp reads per layer as one value. Every reader raises a HyperparameterError that
names the key, so a malformed file stops before any of its numbers is used (labkit.model.config)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labkit.errors import HyperparameterError, UnsupportedArchitectureError

MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: its per-layer arrays hold no more
MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS
U32_MAX = 2**32 - 1  # llama.cpp reads every count as a uint32


def meta_value(meta: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in meta:
        return meta[key]
    if default is ...:
        raise HyperparameterError(f"GGUF metadata lacks required key {key!r}")
    return default


def meta_count(meta: dict[str, Any], key: str, default: Any = ..., low: int = 1, high: int = U32_MAX) -> int:
    """An integer hyperparameter (its type checked at open), between `low` and `high` (a uint32's maximum)."""
    return in_range(key, int(meta_value(meta, key, default)), low, high)


def in_range(key: str, value: int, low: int = 1, high: int = U32_MAX) -> int:
    if not low <= value <= high:
        raise HyperparameterError(f"{key} is {value}; it must be between {low} and {high}")
    return value


def meta_per_layer(meta: dict[str, Any], key: str, n_layers: int, default: Any = ..., low: int = 1) -> int:
    """A count llama.cpp reads as one number or one per layer (get_key_or_arr); labkit runs one."""
    value = meta_value(meta, key, default)
    if not isinstance(value, (np.ndarray, list, tuple)):
        return in_range(key, int(value), low)
    if len(value) != n_layers:
        raise HyperparameterError(f"{key} has {len(value)} entries for {n_layers} layers")
    widths = {in_range(f"{key}[{i}]", int(v), low) for i, v in enumerate(value)}
    if len(widths) != 1:
        raise UnsupportedArchitectureError(f"{key} differs between layers ({sorted(widths)}): labkit runs one value")
    return widths.pop()


def meta_positive_float(meta: dict[str, Any], key: str, default: float, low: float = 0.0) -> float:
    """A float hyperparameter that is finite and above `low` (a NaN rope base would run as a model)."""
    value = float(meta_value(meta, key, default))
    if not (math.isfinite(value) and value > low):
        raise HyperparameterError(f"{key} is {value}; it must be a finite number above {low:g}")
    return value


def meta_finite(meta: dict[str, Any], key: str, default: float) -> float:
    value = float(meta_value(meta, key, default))
    if not math.isfinite(value):
        raise HyperparameterError(f"{key} is {value}; it must be a finite number")
    return value
