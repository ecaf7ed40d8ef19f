"""QUANT_TABLES on the device: the I-quant grids and FP4 values (ops/quant_tables.py), written once
per device and bound as group 1 by each kernel whose block reader indexes them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import wgpu

from labkit.ops.quant_tables import TABLE_GROUP, table_words

_BUFFERS: dict[int, tuple[Any, Any]] = {}  # id(device) -> (device, buffer): the device kept alive with it


def table_buffer(gpu: Any) -> Any:
    """The device's QUANT_TABLES buffer, created on first use."""
    key = id(gpu.device)
    if key not in _BUFFERS:
        buf = gpu.device.create_buffer_with_data(data=table_words(), usage=wgpu.BufferUsage.STORAGE)
        _BUFFERS[key] = (gpu.device, buf)
    return _BUFFERS[key][1]


_GROUPS: dict[int, tuple[Any, Any]] = {}  # id(pipeline) -> (the pipeline, kept alive; its group 1)


@lru_cache(maxsize=4096)
def reads_tables(source: str) -> bool:
    """Whether a kernel source reads QUANT_TABLES (asked per dispatch: one search per source)."""
    return "QUANT_TABLES" in source


def tables_bind_group(gpu: Any, pipeline: Any, source: str) -> Any | None:
    """Bind group 1 for a kernel whose source reads QUANT_TABLES; None for any other. Made once per
    pipeline: every dispatch of that kernel binds the same table buffer."""
    if not reads_tables(source):
        return None
    held = _GROUPS.get(id(pipeline))
    if held is None or held[0] is not pipeline:
        held = _GROUPS[id(pipeline)] = (pipeline, gpu.fresh.bind(pipeline, [table_buffer(gpu)], TABLE_GROUP))
    return held[1]
