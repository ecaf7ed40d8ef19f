"""Reading captures back: regions copied into mappable staging buffers, then into host arrays.

A capture may be cut to chosen positions (`lab.run(..., positions="last")`): only those rows
are copied, so a long prompt does not read back [T, 262144] logits to look at one row. The
copies are packed into staging buffers of at most the device's max-buffer-size each, a copy cut
across two when it does not fit (a pass capturing every stage of a 1024-token prompt holds
2.9 GB, over lavapipe's 2 GiB), so no capture set is ever allocated as one buffer larger than
the device allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import wgpu

from labkit.captures import is_attention_map
from labkit.gpu.plan_cache import active_cache

COPY_ALIGN = 256  # staging offsets: copy_buffer_to_buffer wants 4; 256 keeps pieces tidy


@dataclass(frozen=True)
class Piece:
    """One copy: `nbytes` from byte `src` of a region's buffer into staging buffer `buf` at `dst`."""

    src: int
    nbytes: int
    buf: int
    dst: int


@dataclass
class Selection:
    """What one capture reads back: its pieces, in order, and the array shape they fill."""

    name: str
    buffer: Any
    pieces: list[Piece]
    shape: tuple[int, ...]
    positions: tuple[int, ...] | None  # the positions its rows hold, when cut


def rows_to_copy(name: str, shape: tuple[int, ...], T: int, positions: list[int] | None):
    """(row spans [(first row, n rows)], rows per span unit, kept positions) of a capture.

    A region of n < T rows holds the last n positions (the unembedding of a last-position pass).
    Attention maps are [heads, q_pos, k_pos]: the query rows are cut in every head."""
    n = shape[1] if is_attention_map(name) and len(shape) == 3 else shape[0]
    first = T - n
    if positions is None:
        return [(0, n)], None
    keep = [p - first for p in positions if first <= p < T]
    spans: list[tuple[int, int]] = []
    for r in keep:
        if spans and spans[-1][0] + spans[-1][1] == r:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((r, 1))
    return spans, tuple(r + first for r in keep)


class Readback:
    """Copies of the captured regions of one pass into staging buffers, and the arrays they hold."""

    def __init__(self, device: Any, plans: list, T: int, positions: list[int] | None = None):
        self.device = device
        limit = int(device.limits.get("max-buffer-size", 1 << 30)) // COPY_ALIGN * COPY_ALIGN
        self.sizes: list[int] = [0]
        self.selections: list[Selection] = []
        for p in plans:
            self.selections.append(self._select(p, T, positions, limit))
        self.staging: list[Any] = []

    def _select(self, plan: Any, T: int, positions: list[int] | None, limit: int) -> Selection:
        name, shape = plan.stage.name, tuple(plan.out.shape)
        spans, held = rows_to_copy(name, shape, T, positions)
        amap = is_attention_map(name) and len(shape) == 3
        row_floats = int(np.prod(shape[2:] if amap else shape[1:]))
        heads = shape[0] if amap else 1
        rows_total = shape[1] if amap else shape[0]
        pieces = []
        for h in range(heads):
            for r0, nr in spans:
                src = 4 * (plan.out.offset + (h * rows_total + r0) * row_floats)
                pieces += self._place(src, 4 * nr * row_floats, limit)
        n_rows = sum(nr for _, nr in spans)
        out_shape = ((heads, n_rows) + shape[2:]) if amap else ((n_rows,) + shape[1:])
        return Selection(name, plan.out.buffer, pieces, out_shape, held)

    def _place(self, src: int, nbytes: int, limit: int) -> list[Piece]:
        """Pieces of `nbytes` from `src`: in the current staging buffer while it has room, then in
        new ones; a copy bigger than `limit` is cut (at 4-byte multiples, as copies require)."""
        out = []
        while nbytes > 0 or not out:
            room = limit - self.sizes[-1]
            if room < min(nbytes, COPY_ALIGN):
                self.sizes.append(0)
                room = limit
            n = min(nbytes, room // 4 * 4)
            dst = self.sizes[-1]
            out.append(Piece(src, n, len(self.sizes) - 1, dst))
            self.sizes[-1] = min(limit, dst + -(-n // COPY_ALIGN) * COPY_ALIGN)
            src, nbytes = src + n, nbytes - n
        return out

    def record(self, enc: Any) -> None:
        """Copy every piece into the staging buffers, in the pass's encoder."""
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        cache = active_cache()
        for i, size in enumerate(self.sizes):
            if not size:
                self.staging.append(None)
            elif cache is not None:
                self.staging.append(cache.buffer(size, usage, f"staging.{i}"))
            else:
                self.staging.append(self.device.create_buffer(size=size, usage=usage))
        for s in self.selections:
            for pc in s.pieces:
                if pc.nbytes:
                    enc.copy_buffer_to_buffer(s.buffer, pc.src, self.staging[pc.buf], pc.dst, pc.nbytes)

    def read(self) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
        """({stage: array}, {stage: positions held} for cut captures), once the copies are submitted."""
        raw = []
        for buf in self.staging:
            if buf is None:
                raw.append(None)
                continue
            buf.map_sync(wgpu.MapMode.READ)
            raw.append(np.frombuffer(buf.read_mapped(copy=True), dtype=np.uint8))
            buf.unmap()
            if active_cache() is None:  # a cached staging buffer serves the next pass
                buf.destroy()
        arrays, held = {}, {}
        for s in self.selections:
            parts = [raw[pc.buf][pc.dst : pc.dst + pc.nbytes] for pc in s.pieces]
            data = np.concatenate(parts) if len(parts) != 1 else parts[0]
            arrays[s.name] = data.view(np.float32).reshape(s.shape).copy()
            if s.positions is not None:
                held[s.name] = s.positions
        return arrays, held


def read_now(device: Any, plans: list, T: int) -> dict[str, np.ndarray]:
    """The regions of `plans` as they are now on the GPU (one submit and wait)."""
    rb = Readback(device, plans, T)
    enc = device.create_command_encoder()
    rb.record(enc)
    device.queue.submit([enc.finish()])
    return rb.read()[0]
