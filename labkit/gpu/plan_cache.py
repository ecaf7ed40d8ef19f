"""Cached plans: the GPU objects of a pass, kept and reused by the next pass of the same shape.

A decode step plans the same stages with the same kernels every token; only the uniforms
(n_past, positions) and the new token's embedding row change. Planning afresh each step made
~6 000 buffers and bind groups per token (0.3 s of Python and driver calls on lavapipe). A
`PlanCache` is an allocator (labkit.gpu.allocator) handed to the pass's planning: within
`with objects.one_pass():`, the k-th request of a pass for a buffer of a given label and size gets
the buffer the k-th request got last pass, a uniform slot is rewritten only when its bytes changed, and a bind group
over the same pipeline and resources is reused. Objects the last pass did not ask for are dropped,
so a long-running lab holds one pass's objects per cache, not a growing pile.

Reuse is safe because a pass reads its captures back to host arrays before the next pass is
submitted, and every write into a reused object goes through the queue, so it lands after the
work submitted before it (a compiled decode step writes its moving words so). lab.run keeps its
last pass to re-run it after a variant switch; the next run of the cache's role takes its buffers,
and that run is the one kept from then on. Which passes use one is decided in labkit.gpu.reuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import wgpu

from labkit.gpu.allocator import bind_group

if TYPE_CHECKING:
    from labkit.gpu.device import GpuDevice


def storage_bytes(n_floats: int) -> int:
    """Bytes of a storage buffer holding n floats: a multiple of 16, at least 16."""
    return max(16, (4 * int(n_floats) + 15) & ~15)


def pow2_at_most(n: int, limit: int) -> int:
    """n rounded up to a power of two, but not past `limit`: a size that grows a little each step
    (a decode step's attention maps, one key longer) keeps its buffer for many steps."""
    return min(1 << (int(n) - 1).bit_length(), limit)


class UniformArena:
    """Many passes' small uniforms in one buffer, each at its own slot, and one queue write per
    step for all that changed. A decode step rewrites about six uniforms per layer (its position
    moved on); one write_buffer each cost 1.7 ms of a Llama-3.2-1B step's 10 ms of Python.

    A slot a cache no longer uses (its uniform changed size, or its pass asked for fewer) is freed
    and given to the next request of its size: a long-lived lab switches kernels many times, and
    slots that were only ever added filled the arena after a few switches (SmolLM2: six switches of
    attn_scores), after which the stages planned again had uniforms of their own (a compiled step
    refuses those: labkit.gpu.compiled_step)."""

    ALIGN = 256  # WebGPU's largest min-uniform-buffer-offset-alignment

    def __init__(self, device: Any, capacity: int = 1 << 18):
        self.device, self.capacity = device, capacity
        self.buffer = device.create_buffer(size=capacity, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.host = bytearray(capacity)  # what the buffer holds once flushed
        self.used = 0  # the end of the slots ever handed out
        self._free: dict[int, list[int]] = {}  # rounded slot size -> offsets of freed slots
        self._lo, self._hi = capacity, 0  # the span written since the last flush

    def alloc(self, size: int) -> int | None:
        """A slot's offset (a freed one of its size first), or None when the arena is full (the
        caller makes its own buffer)."""
        rounded = self.slot_bytes(size)
        freed = self._free.get(rounded)
        if freed:
            return freed.pop()
        off = self.used
        if off + rounded > self.capacity:
            return None
        self.used = off + rounded
        return off

    def free(self, off: int, size: int) -> None:
        """Slot `off` of `size` bytes is no longer bound by its cache's plans: the next alloc may take it."""
        self._free.setdefault(self.slot_bytes(size), []).append(off)

    @classmethod
    def slot_bytes(cls, size: int) -> int:
        """The bytes a slot for `size` bytes takes: whole ALIGNs (a uniform binding's offset alignment)."""
        return -(-size // cls.ALIGN) * cls.ALIGN

    @property
    def n_free(self) -> int:
        """Freed slots not yet handed out again (tests)."""
        return sum(map(len, self._free.values()))

    def write(self, off: int, data: bytes) -> None:
        end = off + len(data)
        if self.host[off:end] != data:
            self.host[off:end] = data
            self._lo, self._hi = min(self._lo, off), max(self._hi, end)

    def touch(self, lo: int, hi: int) -> None:
        """Bytes lo..hi of `host` were written in place (a compiled step's moving words): flush them."""
        self._lo, self._hi = min(self._lo, lo), max(self._hi, hi)

    def flush(self) -> None:
        """Write what changed to the GPU: queue-ordered after every submit before it."""
        if self._hi > self._lo:
            self.device.queue.write_buffer(self.buffer, self._lo, memoryview(self.host)[self._lo : self._hi])
            self._lo, self._hi = self.capacity, 0


class PlanCache:
    """An allocator (labkit.gpu.allocator) that hands each request the object the same request got
    last pass."""

    keeps = True  # its objects outlive the pass

    def __init__(self, gpu: GpuDevice, round_limit: int = 0, arena: UniformArena | None = None):
        """`round_limit`: storage buffers are rounded up to a power of two while that stays within it,
        so the attention maps a decode step grows by one key reuse one buffer for many steps.
        `arena`: uniforms live in its slots, written when it is flushed (a decode step's caches)."""
        self.gpu, self.device, self.round_limit, self.arena = gpu, gpu.device, int(round_limit), arena
        self._slots: list[tuple[int, int] | None] = []  # uniform i's (offset, size) in the arena, None: full
        self._buffers: dict[tuple, list[Any]] = {}
        self._uniforms: list[tuple[Any, bytes]] = []
        self._binds: dict[tuple, Any] = {}
        self._used_buffers: dict[tuple, int] = {}
        self._used_binds: set[tuple] = set()
        self._n_uniforms = 0
        self.created = 0  # GPU objects created through this cache (tests: a warm step creates none)

    def one_pass(self) -> _OnePass:
        """Build one pass from this cache (`with objects.one_pass():`): its requests are counted from
        the first again, and on exit what it did not ask for is dropped."""
        return _OnePass(self)

    def stage_done(self) -> None:
        """Nothing to do: its operand textures are kept per request, not passed between stages."""

    def buffer(self, size: int, usage: int, label: str = "") -> Any:
        """The buffer this request got last pass (same label, size, usage, order), or a new one."""
        if size <= self.round_limit and usage & wgpu.BufferUsage.STORAGE:
            size = pow2_at_most(size, self.round_limit)
        key = (label, int(size), int(usage))
        i = self._used_buffers.get(key, 0)
        self._used_buffers[key] = i + 1
        pool = self._buffers.setdefault(key, [])
        if i == len(pool):
            pool.append(self.device.create_buffer(size=size, usage=usage, label=label))
            self.created += 1
        return pool[i]

    def texture_view(self, size: tuple[int, int], fmt: str, usage: int, label: str = "") -> Any:
        """A view of the texture this request got last pass (same label, size, format, usage,
        order), or of a new one. The view is what is kept: a bind group over it is reused too."""
        key = ("texture", label, *size, fmt, int(usage))
        i = self._used_buffers.get(key, 0)
        self._used_buffers[key] = i + 1
        pool = self._buffers.setdefault(key, [])
        if i == len(pool):
            tex = self.device.create_texture(size=(*size, 1), format=fmt, usage=usage, label=label)
            pool.append(tex.create_view())
            self.created += 1
        return pool[i]

    def data(self, data: bytes, usage: int, label: str = "") -> Any:
        """A buffer holding `data`: a reused one, rewritten."""
        buf = self.buffer(max(16, -(-len(data) // 16) * 16), usage | wgpu.BufferUsage.COPY_DST, label)
        self.device.queue.write_buffer(buf, 0, data)
        return buf

    def uniform(self, data: bytes) -> Any:
        """The pass's next uniform slot, rewritten only if its bytes changed: a buffer, or with an
        arena (buffer, offset, size) of its slot. While the arena is full, a buffer of its own,
        until a slot of its size is freed (asked again each pass)."""
        i = self._n_uniforms
        self._n_uniforms += 1
        arena = self.arena
        if arena is None:
            return self.uniform_buffer(i, data)
        slot = self._slots[i] if i < len(self._slots) else None
        if slot is None or slot[1] != len(data):
            if slot is not None:
                arena.free(*slot)
            off = arena.alloc(len(data))
            slot = None if off is None else (off, len(data))
            self._slots[i : i + 1] = [slot]  # replaces slot i, or appends it
        if slot is None:
            return self.uniform_buffer(i, data)
        if i < len(self._uniforms):
            self._uniforms[i] = None  # a buffer of its own from a full arena, no longer bound
        arena.write(slot[0], data)
        return (arena.buffer, slot[0], len(data))

    def uniform_buffer(self, i: int, data: bytes) -> Any:
        """Uniform i as a buffer of its own, rewritten only if its bytes changed."""
        self._uniforms += [None] * (i - len(self._uniforms))  # uniforms before i were arena slots
        if i < len(self._uniforms) and self._uniforms[i] is not None and self._uniforms[i][0].size == len(data):
            buf, old = self._uniforms[i]
            if old != data:
                self.device.queue.write_buffer(buf, 0, data)
                self._uniforms[i] = (buf, data)
            return buf
        usage = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
        buf = self.device.create_buffer_with_data(data=data, usage=usage)
        self.created += 1
        if i < len(self._uniforms):
            self._uniforms[i] = (buf, data)
        else:
            self._uniforms.append((buf, data))
        return buf

    def bind(self, pipeline: Any, resources: list[Any], group: int = 0) -> Any:
        """A bind group over the same pipeline and resources as last pass, or a new one."""
        key = (id(pipeline), group, *(_resource_key(r) for r in resources))
        self._used_binds.add(key)
        if key not in self._binds:
            # the value keeps pipeline and buffers alive, so their ids cannot be reused while cached
            self._binds[key] = (bind_group(self.device, pipeline, resources, group), pipeline, resources)
            self.created += 1
        return self._binds[key][0]

    def _trim(self) -> None:
        """Drop what the pass did not ask for (nothing, in a warm step: then nothing is rebuilt)."""
        used = self._used_buffers
        if len(used) != len(self._buffers) or any(len(v) != used.get(k, -1) for k, v in self._buffers.items()):
            self._buffers = {k: v[: used[k]] for k, v in self._buffers.items() if k in used}
        if len(self._used_binds) != len(self._binds):
            self._binds = {k: v for k, v in self._binds.items() if k in self._used_binds}
        del self._uniforms[self._n_uniforms :]
        for slot in self._slots[self._n_uniforms :]:
            if slot is not None:
                self.arena.free(*slot)
        del self._slots[self._n_uniforms :]

    @property
    def own_uniforms(self) -> int:
        """Uniforms held as buffers of their own, not arena slots (a full arena)."""
        return sum(u is not None for u in self._uniforms)

    @property
    def n_objects(self) -> int:
        """Buffers, uniforms and bind groups held now."""
        uniforms = sum(u is not None for u in self._uniforms)
        return sum(map(len, self._buffers.values())) + uniforms + len(self._binds)


class _OnePass:
    """PlanCache.one_pass's context: a class, not a generator (entered once per pass)."""

    __slots__ = ("objects",)

    def __init__(self, objects: PlanCache):
        self.objects = objects

    def __enter__(self) -> PlanCache:
        c = self.objects
        c._used_buffers, c._used_binds, c._n_uniforms = {}, set(), 0
        return c

    def __exit__(self, *exc) -> None:
        self.objects._trim()


def _resource_key(r: Any) -> tuple:
    if isinstance(r, tuple):
        buf, offset, size = r
        return (id(buf), int(offset), int(size))
    if isinstance(r, wgpu.GPUTextureView):
        return (id(r), 0, 0)
    return (id(r), 0, int(r.size))
