"""The GPU weight store: a model's weights on the device, as the kernels read them, held once.

A matmul weight is uploaded as its GGUF bytes (row windows above the binding limit), or
repacked on the GPU by a kernel's reader into the int8 layout the fast drivers read; norm
weights and biases are small f32 vectors decoded on the host. What is uploaded is kept
until the store goes: on lavapipe every buffer is host memory.

One store serves every executor of the same file on the same device (`shared_store`): a
notebook or a test session that opens a model several times holds its weights once. A
faulty reader's repack is its own entry (keyed by the reader's source), so a lab that
selects `mins_added` never changes what another lab reads.
"""

from __future__ import annotations

import time
import weakref
from pathlib import Path

import numpy as np
import wgpu

from labkit.gpu.dispatch import wait_idle
from labkit.gpu.repack import layout_of, repack_weight, upload_blocks
from labkit.gpu.weights import GpuWeight, upload_weight
from labkit.model.dequant import dequantize
from labkit.model.gguf_file import GgufFile
from labkit.ops.matmul import REPACK_PARAMS

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


class WeightStore:
    """Weights of one GGUF file on one device: GGUF bytes, repacked layouts and f32 vectors."""

    def __init__(self, gpu, gguf: GgufFile):
        self.gpu, self.gguf = gpu, gguf
        self._raw: dict[tuple, GpuWeight] = {}  # (name, rows, window bytes)
        self._repacked: dict[tuple, GpuWeight] = {}  # (name, rows, reader source, binding limit, window bytes)
        self._vectors: dict[str, wgpu.GPUBuffer] = {}
        self.upload_seconds = 0.0

    def raw(self, name: str, rows: tuple[int, int] | None = None, window_bytes: int | None = None) -> GpuWeight:
        """A matmul weight (or a row range of one): GGUF bytes uploaded unchanged, in row windows
        above the binding limit (or of at most `window_bytes`)."""
        key = (name, rows, window_bytes)
        if key not in self._raw:
            t0 = time.perf_counter()
            t = self.gguf.tensors[name]
            raw, n_rows, label = self._rows_of(name, rows)
            self._raw[key] = upload_weight(
                self.gpu, label, raw, t.ggml_type, n_rows, t.n_cols, max_window_bytes=window_bytes
            )
            # write_buffer stages a host copy until the queue flushes: flush per tensor so staging
            # never piles up, then drop the mapped pages (lavapipe keeps the buffer in host memory).
            self.gpu.device.queue.submit([])
            self.gguf.release(name)
            self.upload_seconds += time.perf_counter() - t0
        return self._raw[key]

    def experts(self, name: str, rows_per_expert: int, window_bytes: int | None = None) -> GpuWeight:
        """A 3-D expert tensor's GGUF bytes, unchanged, in windows of whole experts (moe_matmul)."""
        key = (name, "experts", window_bytes)
        if key not in self._raw:
            t0 = time.perf_counter()
            t = self.gguf.tensors[name]
            self._raw[key] = upload_weight(self.gpu, name, self.gguf.raw(name), t.ggml_type, t.n_rows, t.n_cols,
                                           max_window_bytes=window_bytes, row_multiple=rows_per_expert)  # fmt: skip
            self.gpu.device.queue.submit([])
            self.gguf.release(name)
            self.upload_seconds += time.perf_counter() - t0
        return self._raw[key]

    def repacked(self, name: str, rows, source: str, limit: int, window_bytes: int | None = None) -> GpuWeight:
        """A matmul weight repacked on the GPU by `source` (the format's reader, or a faulty
        variant's), once per weight and reader. The GGUF bytes are uploaded for the repack and then
        dropped (lavapipe holds GPU buffers in host memory); a raw-bytes kernel uploads them again."""
        key = (name, rows, source, limit, window_bytes)
        if key not in self._repacked and layout_of(source).name == "blocks":
            self._repacked[key] = self._blocks(name, rows, layout_of(source), limit, window_bytes)
        if key not in self._repacked:
            raw_key = (name, rows, window_bytes)
            had_raw = raw_key in self._raw
            raw = self.raw(name, rows, window_bytes)
            t0 = time.perf_counter()
            REPACK_PARAMS.check(source, f"repack {raw.type_name}")
            self._repacked[key] = repack_weight(self.gpu, raw, source, limit)
            if not had_raw:  # wgpu keeps the buffers alive until the submitted repack has run
                del self._raw[raw_key]
            # wait for the repack, so wgpu frees the GGUF upload and the staging buffer now (lavapipe
            # holds them in host memory), not after every weight has piled up its own
            wait_idle(self.gpu)
            self.upload_seconds += time.perf_counter() - t0
        return self._repacked[key]

    def _blocks(self, name: str, rows, layout, limit: int, window_bytes: int | None) -> GpuWeight:
        """The blocks layout written from the mapped file into textures, a window at a time."""
        t0 = time.perf_counter()
        t = self.gguf.tensors[name]
        raw, n_rows, label = self._rows_of(name, rows)
        weight = upload_blocks(self.gpu, label, raw, t.ggml_type, n_rows, t.n_cols, layout, limit, window_bytes)
        # write_texture stages a host copy until the queue has run it: wait, so the next tensor's
        # staging reuses this one's memory instead of piling up beside it; then drop the mapped pages
        wait_idle(self.gpu)
        self.gguf.release(name)
        self.upload_seconds += time.perf_counter() - t0
        return weight

    def _rows_of(self, name: str, rows: tuple[int, int] | None) -> tuple[np.ndarray, int, str]:
        """A tensor's mapped bytes, or those of a row range (rows are contiguous in every format),
        with its row count and label."""
        t = self.gguf.tensors[name]
        raw = self.gguf.raw(name)
        if rows is None:
            return raw, t.n_rows, name
        per_row = raw.nbytes // t.n_rows
        return raw.reshape(-1)[rows[0] * per_row : rows[1] * per_row], rows[1] - rows[0], f"{name}[{rows[0]}:{rows[1]}]"

    def holds(self, name: str, rows, source: str | None, limit: int, window_bytes: int | None = None) -> bool:
        """Whether the weight is on the device in the layout `source` repacks to (GGUF bytes: None)."""
        if source is None:
            return (name, rows, window_bytes) in self._raw
        return (name, rows, source, limit, window_bytes) in self._repacked

    def vector(self, name: str) -> wgpu.GPUBuffer:
        """A 1-D tensor (norm weight, bias) as f32: tiny, so decoded on the host."""
        if name not in self._vectors:
            t = self.gguf.tensors[name]
            data = dequantize(self.gguf.raw(name), t.ggml_type, t.shape).astype(np.float32).ravel()
            self._vectors[name] = self.gpu.device.create_buffer_with_data(data=data.tobytes(), usage=STORAGE)
        return self._vectors[name]

    def nbytes(self) -> int:
        """Bytes of weight buffers on the device (host memory on lavapipe)."""
        weights = [*self._raw.values(), *self._repacked.values()]
        windows = sum(win.nbytes for w in weights for win in w.windows)
        return windows + sum(b.size for b in self._vectors.values())


_SHARED: weakref.WeakValueDictionary[tuple, WeightStore] = weakref.WeakValueDictionary()


def shared_store(gpu, gguf: GgufFile) -> WeightStore:
    """The store for this file (by path, size and modification time) on this device, shared by its
    executors while any of them is alive."""
    p = Path(gguf.path).resolve()
    st = p.stat()
    key = (id(gpu), str(p), st.st_size, st.st_mtime_ns)
    store = _SHARED.get(key)
    if store is None:
        store = WeightStore(gpu, gguf)
        _SHARED[key] = store
    return store
