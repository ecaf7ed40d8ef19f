"""gguf-py's GGUFReader, with the metadata arrays parsed in one pass instead of one call an element.

transformers reads a GGUF file through `gguf.GGUFReader`, which parses an array of N values by N
recursive calls, each slicing a `np.memmap` (whose slicing hooks dominate). Gemma 3's tokenizer
holds three arrays of 262,144 entries: 23 s a load on a 2-core host, most of a transformers load
of a 270M model. This reader builds the same fields (the same parts, data indices and types, as
views of the same file) from plain ndarray views in one loop an array. Arrays of arrays, and
everything that is not an array, go to gguf-py's own code.
"""

from __future__ import annotations

import struct
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType


class FastGGUFReader(gguf.GGUFReader):
    """A GGUFReader whose metadata arrays of scalars or strings are parsed in one pass."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[GGUFValueType]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype = GGUFValueType(raw_itype[0])
        start, n = orig_offs + 12, int(alen[0])
        if itype == GGUFValueType.STRING:
            items, end = self._string_parts(start, n)
        elif itype in self.gguf_scalar_to_np:
            items, end = self._scalar_parts(start, n, self.gguf_scalar_to_np[itype])
        else:  # arrays of arrays
            return super()._get_field_parts(orig_offs, raw_type)
        per_item = 2 if itype == GGUFValueType.STRING else 1
        data_idxs = [2 + i * per_item + per_item - 1 for i in range(n)]
        types = [GGUFValueType.ARRAY, itype] if n else [GGUFValueType.ARRAY]  # gguf-py types an empty array so
        return end - orig_offs, [raw_itype, alen, *items], data_idxs, types

    def _plain(self) -> np.ndarray:
        """The file's bytes as a plain ndarray view of the memory map (slices skip memmap's hooks)."""
        return self.data.view(np.ndarray)

    def _ordered(self, arr: np.ndarray) -> np.ndarray:
        """`arr` in the file's byte order, as gguf-py's `_get` gives it."""
        return arr.view(arr.dtype.newbyteorder(self.byte_order))

    def _scalar_parts(self, offs: int, n: int, nptype: Any) -> tuple[list[np.ndarray], int]:
        """One one-element view an entry, as gguf-py's per-element parse gives them."""
        size = np.dtype(nptype).itemsize
        whole = self._ordered(self._plain()[offs : offs + size * n].view(nptype))
        return [whole[i : i + 1] for i in range(n)], offs + size * n

    def _string_parts(self, offs: int, n: int) -> tuple[list[np.ndarray], int]:
        """(length, bytes) views an entry; the lengths are read in the file's byte order."""
        flat = self._plain()
        length = struct.Struct(">Q" if self.byte_order == "S" else "<Q")
        raw = memoryview(flat)
        parts: list[np.ndarray] = []
        for _ in range(n):
            (slen,) = length.unpack_from(raw, offs)
            parts.append(self._ordered(flat[offs : offs + 8].view(np.uint64)))
            parts.append(flat[offs + 8 : offs + 8 + slen])
            offs += 8 + slen
        return parts, offs
