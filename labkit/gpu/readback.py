"""Reading captures back: regions copied into a mappable staging buffer, then into host arrays.

A capture may be cut to chosen positions (`lab.run(..., positions="last")`): only those rows
are copied, so a long prompt does not read back [T, 262144] logits to look at one row. The
copies are packed into rounds of at most 256 MiB (and the device's max-buffer-size), a copy cut
across two when it does not fit, read one after another through one staging buffer: a pass
capturing every stage of a 1024-token prompt holds 2.9 GB, over lavapipe's 2 GiB, and no
capture set is ever allocated as one buffer, nor held twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import wgpu

from labkit.gpu.allocator import Allocator

COPY_ALIGN = 256  # staging offsets: copy_buffer_to_buffer wants 4; 256 keeps pieces tidy
STAGING_BYTES = 256 << 20  # the most bytes read back in one round


@dataclass(frozen=True)
class Piece:
    """One copy: `nbytes` from byte `src` of a region's buffer into staging buffer `buf` at `dst`."""

    src: int
    nbytes: int
    buf: int
    dst: int


@dataclass
class CaptureCopy:
    """What one capture reads back: its pieces, in order, and the array shape they fill."""

    name: str
    buffer: Any
    pieces: list[Piece]
    shape: tuple[int, ...]
    positions: tuple[int, ...] | None  # the positions its rows hold, when cut
    heads: tuple[int, ...] | None = None  # the heads an attention map holds, when cut
    dtype: type = np.float32  # int32 for integer ids (a region's "ids" layout): the same 4 bytes


def rows_to_copy(shape: tuple[int, ...], T: int, positions: list[int] | None, by_heads: bool = False):
    """(row spans [(first row, n rows)], rows per span unit, kept positions) of a capture.

    A region of n < T rows holds the last n positions (the unembedding of a last-position pass).
    Attention maps are [heads, q_pos, k_pos]: the query rows are cut in every head."""
    n = shape[1] if by_heads else shape[0]
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
    """Copies of the captured regions of one pass into a staging buffer, and the arrays they hold.

    The copies are packed into rounds of at most STAGING_BYTES (and the device's max-buffer-size):
    the first round is recorded in the pass's own encoder, each later one is copied, mapped and
    read in turn through the same staging buffer. So reading back every stage of 512 Gemma
    tokens (1.2 GB) holds 256 MiB of staging, not a second copy of the captures."""

    def __init__(
        self, device: Any, plans: list, T: int, positions: list[int] | None = None, heads: list[int] | None = None
    ):
        """`positions`: the rows kept (query rows of attention maps); `heads`: the attention-map
        heads kept. None: all."""
        self.device, self.heads = device, heads
        limit = min(int(device.limits.get("max-buffer-size", 1 << 30)), STAGING_BYTES) // COPY_ALIGN * COPY_ALIGN
        self.sizes: list[int] = [0]  # bytes of each round
        self.copies: list[CaptureCopy] = []
        for p in plans:
            self.copies.append(self._select(p, T, positions, limit))
        self.staging: Any = None
        self.owns_staging = False  # made (and destroyed) here, not lent by the caller or a plan cache

    def _select(self, plan: Any, T: int, positions: list[int] | None, limit: int) -> CaptureCopy:
        name, shape = plan.stage.name, tuple(plan.out.shape)
        amap = plan.out.layout == "heads" and len(shape) == 3  # the region says how its rows lie
        whole = plan.out.layout == "state"  # one row, the layer's whole state: never cut to positions
        spans, held = rows_to_copy(shape, shape[0] if whole else T, None if whole else positions, amap)
        row_floats = int(np.prod(shape[2:] if amap else shape[1:]))
        heads = self.heads if amap and self.heads is not None else list(range(shape[0] if amap else 1))
        rows_total = shape[1] if amap else shape[0]
        pieces = []
        for h in heads:
            for r0, nr in spans:
                src = 4 * (plan.out.offset + (h * rows_total + r0) * row_floats)
                pieces += self._place(src, 4 * nr * row_floats, limit)
        n_rows = sum(nr for _, nr in spans)
        out_shape = ((len(heads), n_rows) + shape[2:]) if amap else ((n_rows,) + shape[1:])
        cut_heads = tuple(heads) if amap and self.heads is not None else None
        dtype = np.int32 if plan.out.layout == "ids" else np.float32
        return CaptureCopy(name, plan.out.buffer, pieces, out_shape, held, cut_heads, dtype)

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

    def record(self, enc: Any, lend: Any = None, objects: Allocator | None = None) -> None:
        """Copy the first round into the staging buffer, in the pass's encoder. The staging buffer is
        `lend` when it is big enough (a streamed pass reads its segments through one), one of
        `objects` when they outlive the pass (a plan cache's), or a new one destroyed after reading."""
        size = max(self.sizes)
        if not size:
            return
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        if lend is not None and lend.size >= size:
            self.staging = lend
        elif objects is not None and objects.keeps:
            self.staging = objects.buffer(size, usage, "staging")
        else:
            self.staging = self.device.create_buffer(size=size, usage=usage)
            self.owns_staging = True
        self._copy_round(enc, 0)

    def _copy_round(self, enc: Any, round_: int) -> None:
        for s in self.copies:
            for pc in s.pieces:
                if pc.buf == round_ and pc.nbytes:
                    enc.copy_buffer_to_buffer(s.buffer, pc.src, self.staging, pc.dst, pc.nbytes)

    def read(
        self, keep_staging: bool = False, into: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """({stage: array}, {stage: positions held} for cut captures, {attention map: heads held} for
        cut maps), once the pass's encoder is submitted. `keep_staging`: the caller lends the
        staging buffer to the next readback (and destroys it in the end). `into`: contiguous arrays
        of the right shape to fill instead of new ones (a chunk's rows of the whole logits).

        Each array is filled straight from the mapped staging memory (a copy out of the mapping
        first and then into the arrays cost 1.5 s for 512 Gemma tokens' logits, 0.15 s now)."""
        into = into or {}
        arrays = {s.name: into[s.name] if s.name in into else np.empty(s.shape, s.dtype) for s in self.copies}
        for s in self.copies:
            assert arrays[s.name].shape == s.shape and arrays[s.name].flags.c_contiguous, s.name
        for round_ in range(len(self.sizes)):
            if round_:  # later rounds: copied now, through the same staging buffer
                enc = self.device.create_command_encoder()
                self._copy_round(enc, round_)
                self.device.queue.submit([enc.finish()])
            if self.staging is not None:
                self._fill(arrays, round_)
        if self.owns_staging and not keep_staging:
            self.staging.destroy()
        held = {s.name: s.positions for s in self.copies if s.positions is not None}
        heads = {s.name: s.heads for s in self.copies if s.heads is not None}
        return arrays, held, heads

    def _fill(self, arrays: dict[str, np.ndarray], round_: int) -> None:
        """Copy one mapped round's pieces to where they belong in their arrays."""
        self.staging.map_sync(wgpu.MapMode.READ, 0, self.sizes[round_])
        try:
            mapped = np.frombuffer(self.staging.read_mapped(0, self.sizes[round_], copy=False), dtype=np.uint8)
            for s in self.copies:
                flat, at = arrays[s.name].reshape(-1).view(np.uint8), 0
                for pc in s.pieces:
                    if pc.buf == round_:
                        flat[at : at + pc.nbytes] = mapped[pc.dst : pc.dst + pc.nbytes]
                    at += pc.nbytes
            del mapped, flat  # no view of the mapping may outlive unmap
        finally:
            self.staging.unmap()


def read_now(device: Any, plans: list, T: int) -> dict[str, np.ndarray]:
    """The regions of `plans` as they are now on the GPU (one submit and wait)."""
    rb = Readback(device, plans, T)
    enc = device.create_command_encoder()
    rb.record(enc)
    device.queue.submit([enc.finish()])
    return rb.read()[0]
