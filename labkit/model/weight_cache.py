"""The reference's dequantized weights under a byte budget, held by the passes that read them.

`gguf.quants` dequantizes every GGUF type in float32 arithmetic and returns float32, so a
float32 copy holds exactly the values the float64 reference computes with (float32 → float64
is exact; tests/model/test_memory_plan.py proves it per type on random blocks). That halves what
the reference used to hold (8 bytes a parameter). A weight is dequantized from the
memory-mapped file when a stage needs it and held while the capacity allows (below); a weight
larger than the whole capacity is never cached: the reference streams it in row chunks.

A full cache evicts, for a weight it does not hold, only weights that neither this pass nor the
last one read (`begin_pass`), least recently used first; when that is not room enough it holds
nothing new: `matmul` streams the weight in row chunks, `get` (vectors) hands it back unheld. A
pass that never calls `begin_pass` (attribution's evaluations) counts as the last one's. A model
larger than the budget is read as the same cyclic scan every pass, and under plain LRU each
weight was evicted just before the next pass needed it: no hits at all (a Llama-3.1-8B pass
decoded all 32 GB again with 18.6 GB held). Now the weights a pass reads first stay, and the
next pass finds them; the memory plan's bound (`shrink_to`) still evicts least recently used first.

Widening float32 to float64 on every matmul costs time (a 7-token Gemma pass: about twice
the matmuls'), so a small model whose float64 copy takes at most a quarter of the capacity
is held in float64, as before: same values, today's speed (`dtype`).

One cache serves every Lab of the same file in a process (`shared_cache`): a notebook (or a
test session) that opens a model twice holds its weights once.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from labkit.model.dequant import dequantize, dequantize_rows
from labkit.model.gguf_file import GgufFile

# x [T, K], a row chunk of W [n, K] -> x @ W.T [T, n], computed in some precision
Product = Callable[[np.ndarray, np.ndarray], np.ndarray]

CHUNK_BYTES = 64 << 20  # float64 bytes of one row chunk of a widened or streamed weight
F64_SHARE = 4  # float64 copies when the model's float64 weights take at most 1/F64_SHARE of the capacity


class WeightCache:
    """Dequantized weights of one GGUF file, at most `capacity` bytes (the module says what stays)."""

    def __init__(self, gguf: GgufFile, capacity: int | None = None):
        self.gguf = gguf
        self.capacity: int | None = None
        self.dtype = np.dtype(np.float64)
        self._held: OrderedDict[str, np.ndarray] = OrderedDict()
        self.loads = 0  # dequantizations done (tests count them)
        self.evictions = 0
        self._pass = 0  # the pass now reading (begin_pass); _read_in: the last pass that read each held weight
        self._read_in: dict[str, int] = {}
        self.on_load: Callable[[str], object] | None = None  # told each weight dequantized whole (a bar)
        self.set_capacity(capacity)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._held.values())

    def __contains__(self, name: str) -> bool:
        return name in self._held

    def __len__(self) -> int:
        return len(self._held)

    def _loaded(self, name: str) -> None:
        self.loads += 1
        if self.on_load is not None:
            self.on_load(name)

    def held_bytes(self, name: str) -> int:
        """Bytes the weight takes once held, in the cache's dtype."""
        return self.dtype.itemsize * n_values(self.gguf, name)

    def fits(self, name: str) -> bool:
        """Whether the whole weight may be held at all under the capacity."""
        return self.capacity is None or self.held_bytes(name) <= self.capacity

    def begin_pass(self) -> None:
        """A new pass starts: weights neither it nor the last pass reads may be evicted for it."""
        self._pass += 1

    def get(self, name: str) -> np.ndarray:
        """The whole weight (read-only, in `dtype`), from the cache or dequantized now. A weight over
        the capacity, or one the full cache has no room for (`_make_room`), is returned without being held."""
        if name in self._held:
            self._held.move_to_end(name)
            self._read_in[name] = self._pass
            return self._held[name]
        # room first: the cache never holds more than its capacity, even while this one decodes
        keep = self.fits(name) and self._make_room(self.held_bytes(name))
        w = self._dequantize(name)
        w.flags.writeable = False
        self._loaded(name)
        if keep:
            self._held[name] = w
            self._read_in[name] = self._pass
        return w

    def holds_or_admits(self, name: str) -> bool:
        """Whether the whole weight is held, or room for it can be made (making that room now)."""
        return name in self._held or (self.fits(name) and self._make_room(self.held_bytes(name)))

    def _dequantize(self, name: str) -> np.ndarray:
        """The whole weight in the cache's dtype, decoded a row chunk at a time with each chunk's
        mapped pages dropped once read: the file's pages never add a whole weight to the peak (an
        8B output matrix is 0.43 GB of them). A float64 cache widens each chunk as it is written,
        never a whole float32 copy: Gemma 3's 672 MB embedding table was copied twice."""
        t = self.gguf.tensors[name]
        if len(t.shape) < 2 or 4 * n_values(self.gguf, name) <= CHUNK_BYTES:
            w = dequantize(self.gguf.raw(name), t.ggml_type, t.shape)
            self.gguf.release(name)
            return w.astype(self.dtype, copy=False)
        out = np.empty((t.n_rows, t.n_cols), dtype=self.dtype)
        step = max(1, CHUNK_BYTES // (8 * t.n_cols))
        for a in range(0, t.n_rows, step):
            out[a : a + step] = self.rows(name, slice(a, a + step))
            self.gguf.release(name)
        return out.reshape(t.shape)

    def rows(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        """Some rows of a 2-D weight (an embedding lookup, a row chunk): from the held copy, else
        only those rows' bytes are read and dequantized (float32)."""
        if name in self._held:
            return self._matrix(name)[ids]
        t = self.gguf.tensors[name]
        return dequantize_rows(self.gguf.raw(name), t.ggml_type, t.n_cols, ids)

    def matmul(
        self, x: np.ndarray, name: str, rows: tuple[int, int] | None = None, product: Product | None = None
    ) -> np.ndarray:
        """x [T, K] (float64) @ W[rows].T in float64: the held weight in one product when it is
        float64, else row chunks widened one at a time (held float32, or streamed from the file).
        `product(x, w_chunk)`, when given, computes each chunk instead (another engine's precision,
        labkit.attribution.emulation), on the same chunks."""
        t = self.gguf.tensors[name]
        r0, r1 = rows or (0, t.n_rows)
        if x.shape[0] == 0:  # no rows: the product's shape only, with no weight read
            return np.empty((0, r1 - r0), dtype=np.float64)
        held = not self.by_rows(name) and self.holds_or_admits(name)
        if product is None and held and self.dtype == np.float64:
            return x @ self._matrix(name)[r0:r1].T
        whole = self._matrix(name) if held else None
        out = np.empty((x.shape[0], r1 - r0), dtype=np.float64)
        step = max(1, CHUNK_BYTES // (8 * t.n_cols))
        for a in range(r0, r1, step):
            b = min(a + step, r1)
            w = whole[a:b] if whole is not None else self.rows(name, slice(a, b))
            out[:, a - r0 : b - r0] = x @ w.astype(np.float64).T if product is None else product(x, w)
            if whole is None:
                self.gguf.release(name)  # the chunk's mapped pages were read once
        if whole is None:
            self._loaded(name)
        return out

    def by_rows(self, name: str) -> bool:
        """A large 3-D expert tensor is never held whole: each product dequantizes the rows of the one
        expert it reads (labkit.ops.moe_matmul), so a pass touches only the experts its tokens chose."""
        t = self.gguf.tensors[name]
        return len(t.shape) == 3 and name not in self._held and 8 * math.prod(t.shape) > CHUNK_BYTES

    def _matrix(self, name: str) -> np.ndarray:
        """The held weight as rows of its last dimension: a 3-D expert tensor's experts stacked."""
        w = self.get(name)
        return w if w.ndim <= 2 else w.reshape(-1, w.shape[-1])

    def set_capacity(self, capacity: int | None) -> None:
        """Bound the cache; a model whose float64 weights take at most 1/F64_SHARE of it is held in
        float64 (the fast products), any other in float32."""
        self.capacity = capacity
        dtype = dtype_for(self.gguf, capacity)
        if dtype != self.dtype:
            self.clear()
            self.dtype = dtype
        if capacity is not None:
            self.shrink_to(capacity)

    def shrink_to(self, nbytes: int) -> None:
        """Evict, least recently used first, until at most `nbytes` are held (the capacity stays): a
        bound the memory plan sets, so what this pass read goes too when it must."""
        while self._held and self.nbytes > nbytes:
            self._evict(next(iter(self._held)))

    def clear(self) -> None:
        self._held.clear()
        self._read_in.clear()

    def _evict(self, name: str) -> None:
        del self._held[name]
        self._read_in.pop(name, None)
        self.evictions += 1

    def _make_room(self, need: int) -> bool:
        """Evict weights that neither this pass nor the last one read, least recently used first, until
        `need` more bytes fit; False, evicting nothing more, when they do not fit without evicting
        a weight still in use (LRU order puts those last)."""
        if self.capacity is None:
            return True
        while self.nbytes + need > self.capacity and self._held:
            oldest = next(iter(self._held))
            if self._read_in.get(oldest, -1) >= self._pass - 1:  # unstamped (put there from outside): stale
                return False
            self._evict(oldest)
        return self.nbytes + need <= self.capacity


def dtype_for(gguf: GgufFile, capacity: int | None) -> np.dtype:
    """float64 when the file's float64 weights take at most 1/F64_SHARE of the capacity, else float32."""
    total = sum(n_values(gguf, n) for n in gguf.tensors)
    return np.dtype(np.float64 if capacity is None or 8 * total * F64_SHARE <= capacity else np.float32)


def n_values(gguf: GgufFile, name: str) -> int:
    return int(np.prod(gguf.tensors[name].shape, dtype=np.int64))


_SHARED: weakref.WeakValueDictionary[tuple, WeightCache] = weakref.WeakValueDictionary()


def shared_cache(gguf: GgufFile) -> WeightCache:
    """The process's cache for this file (by path, size and modification time): labs of one file
    share their dequantized weights while any of them is alive."""
    p = Path(gguf.path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    cache = _SHARED.get(key)
    if cache is None:
        cache = WeightCache(gguf)
        _SHARED[key] = cache
    return cache


def release_all() -> int:
    """Drop every held dequantized weight of every file in this process (they are dequantized again
    when next needed); returns the bytes freed. A notebook between experiments, a test between
    modules."""
    freed = 0
    for cache in list(_SHARED.values()):
        freed += cache.nbytes
        cache.clear()
    return freed
