"""Scratch regions: buffers of stages no one captures, handed on once their last reader is recorded.

A pass that captures every stage gives each stage a region of its own: the captures are copied
at the end of the encoder, and a re-run after a variant switch reuses the regions upstream of
the switch. A pass that captures a few stages does not need the others after their readers have
run. Layer after layer has the same shapes, so layer L + 1's q takes the buffer layer L's q left:
2048 Gemma tokens captured at `output_norm` hold two 64 MiB attention maps instead of 36, and
lavapipe (whose GPU memory is host memory) no longer touches 4 GB of fresh pages per pass.

A long pass streams its captures too: every region is scratch, a captured one held until the
end of its segment, where the executor submits what is recorded and reads that segment's
captures back. Segments end once SEGMENT_BYTES have been captured, so a 512-token Gemma pass
capturing every stage (1.2 GB) holds its host arrays and a few hundred MB of regions, not a
second 1.2 GB on the device (lavapipe's device memory is host memory).

A pass built on scratch regions cannot be re-run from its middle: its regions were overwritten
(`PassResult.reusable` is False, and the executor plans the next pass of the same ids afresh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.gpu.plan_cache import pow2_at_most, storage_bytes

# captured bytes per segment of a streamed pass (its staging round): against 256 MiB, a 512-token
# Gemma pass capturing every stage peaked at 2.28 GB RSS instead of 2.63, in the same time
SEGMENT_BYTES = 128 << 20
# a pass of this many tokens or more streams: every region scratch, captures read per segment
STREAM_MIN_TOKENS = 256


class ScratchPool:
    """Buffers for the regions of stages outside `keep`, recycled by exact size."""

    def __init__(
        self,
        allocate: Callable[[int, str], Any],
        last_reader: dict[str, int],
        keep: set[str],
        round_below: int = 0,
        streamed: set[str] | None = None,
    ):
        """`round_below`: sizes up to it are rounded up to a power of two, so a decode step's
        attention maps, one key longer each step, keep their buffer (and its bind groups).
        `streamed`: the captured stages of a streamed pass, held until their segment ends."""
        self.allocate, self.last_reader, self.keep, self.round_below = allocate, last_reader, keep, round_below
        self.streamed = streamed or set()
        self.pinned: set[str] = set()
        self.segment_bytes = 0  # captured since the last segment end
        self.free: dict[int, list[Any]] = {}
        self.held: dict[str, tuple[int, Any]] = {}  # stage -> (size asked, buffer) until its last reader
        self.created = 0

    def wants(self, name: str) -> bool:
        """Whether the stage's region may be a scratch buffer (it is not kept)."""
        return name not in self.keep

    def take(self, n_floats: int, name: str) -> Any:
        """A buffer of n floats for stage `name`: one a finished stage left, or a new one."""
        size = storage_bytes(n_floats)
        if size <= self.round_below:
            size = pow2_at_most(size, self.round_below)
        pool = self.free.get(size)
        if pool:
            buf = pool.pop()
        else:
            buf = self.allocate(size // 4, f"scratch {size}")
            self.created += 1
        self.held[name] = (size, buf)  # keyed by the size asked: a plan cache may round the buffer up
        return buf

    def recorded(self, index: int, name: str, nbytes: int) -> bool:
        """Stage `index` (`name`, whose region holds `nbytes`) is recorded: the buffers whose last
        reader it was are free for later stages, but a streamed capture's only once its segment
        ends. True when the segment ends here (SEGMENT_BYTES captured)."""
        end = False
        if name in self.streamed:
            self.pinned.add(name)
            self.segment_bytes += nbytes
            if self.segment_bytes >= SEGMENT_BYTES:
                self.pinned, self.segment_bytes, end = set(), 0, True
        for n in [n for n in self.held if self.last_reader.get(n, -1) <= index and n not in self.pinned]:
            size, buf = self.held.pop(n)
            self.free.setdefault(size, []).append(buf)
        return end
