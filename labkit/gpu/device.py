"""The WebGPU device: one cached `GpuDevice` per process.

`get_device()` picks an adapter (a real GPU first, then a Vulkan CPU adapter such as
Mesa's lavapipe), requests the adapter's real limits (WebGPU's defaults are far lower:
128 MiB storage bindings instead of 2 GiB buffers, ...) and the optional features the
kernels can use (timestamp-query, shader-f16, subgroups) when the adapter has them.
An OpenGL adapter is refused: it has no f16 and no subgroups, and its compute path is
not what the kernels are written for.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import wgpu

from labkit.errors import NoAdapterError
from labkit.gpu.allocator import FreshObjects
from labkit.gpu.ffi_types import install_for_wgpu

# Limits requested at the adapter's own value (WebGPU hands out spec minimums otherwise).
WANTED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroups-per-dimension",
    "max-uniform-buffer-binding-size",
    "max-uniform-buffers-per-shader-stage",
    "max-bind-groups",
    "max-texture-dimension-2d",
    "max-bindings-per-bind-group",
    "min-storage-buffer-offset-alignment",
    "min-uniform-buffer-offset-alignment",
)

# Optional features, requested only when present. wgpu-py 0.32 spells subgroups "subgroup".
WANTED_FEATURES = (
    "timestamp-query",
    "timestamp-query-inside-encoders",
    "timestamp-query-inside-passes",
    "shader-f16",
    "subgroup",
    "subgroups",
)

# Lower is better. OpenGL adapters are never picked.
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}

INSTALL_HINT = (
    "no usable WebGPU adapter (a GPU, or Vulkan on the CPU). On Debian/Ubuntu install "
    "Mesa's Vulkan drivers (lavapipe): apt-get install mesa-vulkan-drivers libvulkan1"
)


@dataclass
class GpuDevice:
    adapter: Any
    device: Any
    queue: Any
    adapter_info: dict
    backend: str
    adapter_type: str
    limits: dict
    features: set[str]
    has_timestamps: bool
    has_f16: bool
    has_subgroups: bool
    # compiled pipelines, keyed by (wgsl, entry); filled by labkit.gpu.shader
    pipelines: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return str(self.adapter_info.get("device") or self.adapter_info.get("description") or "")

    @property
    def is_cpu(self) -> bool:
        return self.adapter_type == "CPU"

    @property
    def has_spare_core(self) -> bool:
        """Whether the host has a core the device's work leaves free: always beside a real GPU; on a CPU
        adapter only when lavapipe runs fewer threads (LP_NUM_THREADS, else one a core) than the cores
        this process may use. Work done while the device runs (a compiled step's look-ahead) is free
        there, and otherwise takes a core from the device's threads (a decode 10 % slower here)."""
        if not self.is_cpu:
            return True
        cores = len(os.sched_getaffinity(0))
        try:
            threads = int(os.environ.get("LP_NUM_THREADS", cores))
        except ValueError:
            threads = cores
        return threads < cores

    @property
    def loop_turn_cap(self) -> int | None:
        """llvmpipe ends an invocation's loops after this many turns in all (labkit.ops.attn_ctx.loop_turns)."""
        return LLVMPIPE_LOOP_TURNS if "llvmpipe" in self.name else None

    @property
    def max_binding(self) -> int:
        """max-storage-buffer-binding-size: the largest window of one storage binding."""
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def max_workgroups(self) -> int:
        return int(self.limits["max-compute-workgroups-per-dimension"])

    @cached_property
    def fresh(self) -> FreshObjects:
        """An allocator making every object new, for work outside a pass (labkit.gpu.allocator)."""
        return FreshObjects(self, recycle_textures=False)


LLVMPIPE_LOOP_TURNS = 65535  # measured on Mesa 22.3: labkit.ops.attn_ctx.loop_turns

_DEVICE: GpuDevice | None = None


def _info(adapter: Any) -> dict:
    return {k: adapter.info[k] for k in adapter.info}


def _rank(adapter: Any) -> tuple[int, int] | None:
    info = adapter.info
    backend = str(info.get("backend_type", ""))
    if backend in ("OpenGL", "OpenGLES", "GL", "Null", "Empty"):
        return None
    kind = str(info.get("adapter_type", "Unknown"))
    # Prefer Vulkan among backends of the same adapter type (Metal/D3D12 are fine too).
    return (_TYPE_RANK.get(kind, 3), 0 if backend == "Vulkan" else 1)


def pick_adapter(adapters: list[Any]) -> Any:
    """The best adapter of a list, or NoAdapterError when only OpenGL (or nothing) is there."""
    ranked = [(r, i, a) for i, a in enumerate(adapters) if (r := _rank(a)) is not None]
    if not ranked:
        seen = ", ".join(
            f"{a.info.get('device', '?')} ({a.info.get('backend_type', '?')}, {a.info.get('adapter_type', '?')})"
            for a in adapters
        )
        raise NoAdapterError(INSTALL_HINT + (f". Adapters seen: {seen}" if seen else ""))
    ranked.sort(key=lambda x: (x[0], x[1]))
    return ranked[0][2]


def _create(adapter: Any) -> GpuDevice:
    have = {str(f) for f in adapter.features}
    features = [f for f in WANTED_FEATURES if f in have]
    alimits = dict(adapter.limits)
    limits = {k: alimits[k] for k in WANTED_LIMITS if k in alimits}
    device = adapter.request_device_sync(label="labkit", required_features=features, required_limits=limits)
    dev_features = {str(f) for f in device.features}
    info = _info(adapter)
    return GpuDevice(
        adapter=adapter,
        device=device,
        queue=device.queue,
        adapter_info=info,
        backend=str(info.get("backend_type", "")),
        adapter_type=str(info.get("adapter_type", "")),
        limits=dict(device.limits),
        features=dev_features,
        has_timestamps="timestamp-query" in dev_features,
        has_f16="shader-f16" in dev_features,
        has_subgroups=bool({"subgroup", "subgroups"} & dev_features),
    )


def _quiet_window_system() -> None:
    """Mesa's Vulkan loader prints "XDG_RUNTIME_DIR is invalid" four times on a headless machine
    (it probes Wayland). Compute needs no window system; give it a private runtime dir."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        d = Path(tempfile.gettempdir()) / f"labkit-runtime-{os.getuid()}"
        d.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(d)


def get_device() -> GpuDevice:
    """The process-wide device (created on first use)."""
    global _DEVICE
    if _DEVICE is None:
        _quiet_window_system()
        install_for_wgpu()  # cffi's type parsing: 1.7 s of every process's first pass, otherwise
        try:
            adapters = list(wgpu.gpu.enumerate_adapters_sync())
        except Exception as e:  # no loader / no driver at all
            raise NoAdapterError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from None
        _DEVICE = _create(pick_adapter(adapters))
    return _DEVICE


def describe() -> dict:
    """A JSON-able summary of the device, for `labkit info`."""
    g = get_device()
    return {
        "device": g.name,
        "vendor": g.adapter_info.get("vendor", ""),
        "description": g.adapter_info.get("description", ""),
        "backend": g.backend,
        "adapter_type": g.adapter_type,
        "features": sorted(g.features),
        "has_timestamps": g.has_timestamps,
        "has_f16": g.has_f16,
        "has_subgroups": g.has_subgroups,
        "limits": {k: int(g.limits[k]) for k in WANTED_LIMITS if k in g.limits},
    }
