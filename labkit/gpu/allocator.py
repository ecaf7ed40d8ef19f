"""Where a pass's GPU objects come from: one allocator object, handed to whatever makes them.

Planning a pass makes buffers, uniform buffers, operand textures and bind groups. Which of them
are new and which are kept from an earlier pass is the allocator's business, and it is named at
every call site that makes one (as ratchet's device pools are):

- `FreshObjects` makes every object new. A pass planned with one recycles its operand textures
  between stages (`stage_done`): a texture filled for one stage serves the next stage that asks for
  the same size, since nothing reads it once its stage is recorded. `GpuDevice.fresh` is one that
  recycles nothing, for work outside a pass (repacking a weight, a test's dispatch).
- `labkit.gpu.plan_cache.PlanCache` hands a pass the objects the same request got last pass.

Both follow `Allocator`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import wgpu

UNIFORM = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST


class Allocator(Protocol):
    """What makes a pass's GPU objects (labkit.gpu.dispatch, the stage host, the readback)."""

    gpu: Any  # the GpuDevice whose objects these are (labkit.gpu.device, which hands out `fresh` ones)

    def buffer(self, size: int, usage: int, label: str = "") -> Any: ...

    def data(self, data: bytes, usage: int, label: str = "") -> Any: ...

    def uniform(self, data: bytes) -> Any: ...

    def texture_view(self, size: tuple[int, int], fmt: str, usage: int, label: str = "") -> Any: ...

    def bind(self, pipeline: Any, resources: list[Any], group: int = 0) -> Any: ...

    def one_pass(self) -> AbstractContextManager:
        """The context one pass is built in (`with objects.one_pass():`)."""

    def stage_done(self) -> None:
        """A stage is recorded: the operand textures it took may serve the next stages."""

    @property
    def keeps(self) -> bool:
        """Whether its objects outlive the pass (a readback's staging buffer is then kept, not destroyed)."""


class FreshObjects:
    """Every object new; operand textures recycled between stages when `recycle_textures`."""

    keeps = False

    def __init__(self, gpu: Any, recycle_textures: bool = True):
        self.gpu, self.device = gpu, gpu.device
        self.recycle = recycle_textures
        self._free: dict[tuple, list[Any]] = {}  # (size, format, usage) -> views a recorded stage left
        self._taken: list[tuple[tuple, Any]] = []

    def buffer(self, size: int, usage: int, label: str = "") -> Any:
        return self.device.create_buffer(size=size, usage=usage, label=label)

    def data(self, data: bytes, usage: int, label: str = "") -> Any:
        return self.device.create_buffer_with_data(data=data, usage=usage)

    def uniform(self, data: bytes) -> Any:
        return self.device.create_buffer_with_data(data=data, usage=UNIFORM)

    def texture_view(self, size: tuple[int, int], fmt: str, usage: int, label: str = "") -> Any:
        key = (*size, fmt, int(usage))
        free = self._free.get(key)
        if free:
            view = free.pop()
        else:
            tex = self.device.create_texture(size=(*size, 1), format=fmt, usage=usage, label=label)
            view = tex.create_view()
        if self.recycle:
            self._taken.append((key, view))
        return view

    def bind(self, pipeline: Any, resources: list[Any], group: int = 0) -> Any:
        return bind_group(self.device, pipeline, resources, group)

    def one_pass(self) -> AbstractContextManager:
        return nullcontext(self)

    def stage_done(self) -> None:
        for key, view in self._taken:
            self._free.setdefault(key, []).append(view)
        self._taken = []


def bind_group(device: Any, pipeline: Any, resources: list[Any], group: int = 0) -> Any:
    """A bind group binding resources[i] at @binding(i): a buffer, (buffer, offset, size) or a texture view."""
    entries = []
    for i, b in enumerate(resources):
        if isinstance(b, tuple):
            buf, offset, size = b
            res = {"buffer": buf, "offset": int(offset), "size": int(size)}
        elif isinstance(b, wgpu.GPUTextureView):
            res = b
        else:
            res = {"buffer": b, "offset": 0, "size": b.size}
        entries.append({"binding": i, "resource": res})
    return device.create_bind_group(layout=pipeline.get_bind_group_layout(group), entries=entries)
