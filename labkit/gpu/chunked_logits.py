"""The unembedding of a long pass, computed and read back in token chunks.

Gemma's logits are 1 MiB per token: 512 MB for a 512-token prompt, 2 GiB at 2048, one byte over
lavapipe's max-buffer-size. Held as one region they were the largest thing a streamed pass
allocated (lavapipe's device memory is host memory, so they were held twice with their host copy),
and at 2048 tokens they could not be allocated at all. So a streamed pass that captures the logits
of many positions plans the unembedding (the graph's last stage) as chunks of about CHUNK_BYTES
over one region: each chunk's matmul is submitted, its rows are read straight into their place in
the host array, and the region serves the next chunk. A chunk none of whose positions is captured
is not computed. Each row is the same computation as in one big matmul (the tiled driver treats
tokens independently), so the logits are the unchunked ones bit for bit (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import wgpu

from labkit.gpu.dispatch import encode, pass_timestamps, resolve_timestamps
from labkit.gpu.readback import Readback

CHUNK_BYTES = 64 << 20  # logits bytes per chunk: 64 Gemma tokens, 336 SmolLM2 ones
TILE = 16  # chunks are whole token tiles of the prefill matmul


def token_spans(T: int, row_bytes: int) -> list[tuple[int, int]]:
    """[(first token, n tokens)] covering T tokens, about CHUNK_BYTES of logits each."""
    n = max(TILE, CHUNK_BYTES // max(row_bytes, 1) // TILE * TILE)
    spans = [(t0, min(n, T - t0)) for t0 in range(0, T, n)]
    if len(spans) > 1 and spans[-1][1] == 1:  # one token would run the decode driver: join it to the last chunk
        spans[-2:] = [(spans[-2][0], spans[-2][1] + 1)]
    return spans


@dataclass
class LogitsChunk:
    """Tokens [t0, t0 + n): their matmul dispatches, writing rows 0..n of the stage's region."""

    t0: int
    n: int
    dispatches: list = field(repr=False)


@dataclass
class ChunkedRead:
    array: np.ndarray
    positions: tuple[int, ...] | None  # the rows held, when positions were cut
    gpu_ms: float  # the chunks' GPU time, when timed
    staging: Any  # the staging buffer to lend on: the one lent, or a bigger one made here


def read_chunks(device: Any, plan: Any, positions: list[int] | None, staging: Any, timed: bool) -> ChunkedRead:
    """Run plan's chunks one by one, each read back into its rows of one host array. `staging` is
    the streamed pass's (or None); one too small is destroyed and the bigger one made here returned."""
    T, width = sum(c.n for c in plan.chunks), plan.out.shape[1]
    rows = list(range(T)) if positions is None else [p for p in positions if 0 <= p < T]
    out = np.empty((len(rows), width), dtype=np.float32)
    at, ms = 0, 0.0
    for c in plan.chunks:
        mine = [p - c.t0 for p in rows if c.t0 <= p < c.t0 + c.n]
        if not mine:
            continue
        enc = device.create_command_encoder()
        qs = device.create_query_set(type=wgpu.QueryType.timestamp, count=2) if timed else None
        encode(enc, c.dispatches, timestamp_writes=pass_timestamps(qs, 0))
        rows_plan = replace(plan, out=replace(plan.out, shape=(c.n, width)), dispatches=[], chunks=[])
        rb = Readback(device, [rows_plan], c.n, None if positions is None else mine)
        rb.record(enc, lend=staging)
        ts_buf = resolve_timestamps(device, enc, qs, 1) if timed else None
        device.queue.submit([enc.finish()])
        rb.read(keep_staging=True, into={plan.stage.name: out[at : at + len(mine)]})
        if rb.owns_staging:  # a bigger staging buffer than the one lent: lend this one on
            if staging is not None:
                staging.destroy()
            staging = rb.staging
        if ts_buf is not None:
            start, end = np.frombuffer(device.queue.read_buffer(ts_buf), dtype=np.uint64)
            ms += float(end - start) / 1e6
        at += len(mine)
    return ChunkedRead(out, None if positions is None else tuple(rows), ms, staging)
