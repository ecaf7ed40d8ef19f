"""Write a copy of a GGUF file with one tensor corrupted the way a converter bug would.

For teaching and for testing the tools that find such bugs (`labkit diff-weights`, dumps
compared stage by stage, `labkit.attribute`): the sign of each quant block's scale `d` is
flipped, so every value of those blocks changes sign, as a converter that mishandles the f16
scale would do (`flip_scale_signs`); or every block's scale is multiplied by a factor near 1,
a fault too small for a total-error comparison against llama.cpp (`scale_block_scales`).
The source file is only read; the copy is a new file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.errors import InvalidArgumentError, UnsupportedTensorTypeError
from labkit.model.gguf_file import open_gguf
from labkit.quant.formats import FORMATS_LIST

Q = GGMLQuantizationType
# Byte offset of the f16 scale `d` inside one block, for every type that has one (its record)
SCALE_OFFSET = {f.qtype: f.scale_at for f in FORMATS_LIST if f.scale_at is not None}
# Float types have no scale: the sign bit of every value is flipped (the byte holding it).
_SIGN_BYTE = {Q.F32: 3, Q.F16: 1, Q.BF16: 1}


def flip_scale_signs(src: str | Path, dst: str | Path, tensor: str, block: int | None = None) -> Path:
    """Copy `src` to `dst` with the sign of `tensor`'s block scales flipped: every block, or only
    block number `block` (in file order). Returns `dst`."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise InvalidArgumentError("flip_scale_signs writes a copy: dst must differ from src")
    info = open_gguf(src).tensors.get(tensor)
    if info is None:
        raise InvalidArgumentError(f"{src} has no tensor {tensor!r}")
    qtype = Q(info.ggml_type)
    if qtype in SCALE_OFFSET:
        byte = SCALE_OFFSET[qtype] + 1  # the high byte of the little-endian f16 holds its sign
    elif qtype in _SIGN_BYTE:
        byte = _SIGN_BYTE[qtype]
    else:
        raise UnsupportedTensorTypeError(f"cannot corrupt {qtype.name} tensors")
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    n_blocks = info.nbytes // block_bytes
    if block is not None and not 0 <= block < n_blocks:
        raise InvalidArgumentError(f"{tensor} has {n_blocks} blocks; block {block} is out of range")
    rows = slice(None) if block is None else slice(block, block + 1)

    def flip(blocks: np.ndarray) -> None:
        blocks[rows, byte] ^= 0x80

    return _edit_copy(src, dst, info, block_bytes, flip)


def scale_block_scales(src: str | Path, dst: str | Path, tensor: str, factor: float) -> Path:
    """Copy `src` to `dst` with every block scale `d` of a quantized `tensor` multiplied by
    `factor` (rounded to f16, as the file stores it). Returns `dst`."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise InvalidArgumentError("scale_block_scales writes a copy: dst must differ from src")
    info = open_gguf(src).tensors.get(tensor)
    if info is None:
        raise InvalidArgumentError(f"{src} has no tensor {tensor!r}")
    qtype = Q(info.ggml_type)
    if qtype not in SCALE_OFFSET:
        raise UnsupportedTensorTypeError(f"{qtype.name} tensors have no block scale to change")
    at = SCALE_OFFSET[qtype]

    def scale(blocks: np.ndarray) -> None:
        d = np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16)
        blocks[:, at : at + 2] = (d.astype(np.float32) * factor).astype(np.float16).view(np.uint8)

    return _edit_copy(src, dst, info, GGML_QUANT_SIZES[qtype][1], scale)


def _edit_copy(src: Path, dst: Path, info, block_bytes: int, edit) -> Path:
    """Copy src to dst, then let `edit` change the tensor's blocks ([n_blocks, block_bytes] bytes) in place."""
    shutil.copyfile(src, dst)
    mm = np.memmap(dst, dtype=np.uint8, mode="r+", offset=info.offset, shape=(info.nbytes // block_bytes, block_bytes))
    edit(mm)
    mm.flush()
    del mm
    return dst
