"""Operands read as textures (labkit/gpu/texture.py): which bindings a kernel reads as textures,
what gets bound for each, and the typed error past the device's texture size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import wgpu

from labkit.errors import GpuLimitError
from labkit.gpu.device import get_device
from labkit.gpu.texture import Rows, bind_operands, fill_texture, texture_bindings
from labkit.ops.base import PassShape, wgsl_file
from labkit.ops.registry import get_kernel, kernel_source

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


@pytest.fixture(scope="module")
def gpu():
    return get_device()


def test_texture_bindings_of_the_shipped_kernels():
    """The prefill scores kernel reads q and K as textures, the prefill context kernel V, the tiled
    and the matvec matmul drivers X; the split-K matvec (for real GPUs), the decode scores and
    context kernels and the fused tiers read buffers."""
    assert texture_bindings(wgsl_file("attn_scores_prefill")) == {0, 1}
    ctx = get_kernel("attn_ctx", "default")
    assert texture_bindings(ctx.source(PassShape(T=9, n_past=0))) == {1}
    assert texture_bindings(ctx.source(PassShape(T=1, n_past=9))) == frozenset()  # decode reads the cache buffer
    assert texture_bindings(wgsl_file("tile16")) == {1}  # the tiled drivers' X
    assert texture_bindings(wgsl_file("matmul_matvec")) == {1}  # llvmpipe loads a buffer a lane at a time
    assert texture_bindings(wgsl_file("quad_rows")) == {1}  # the blocks layout's matvec drivers
    assert texture_bindings(wgsl_file("splitk_rows")) == frozenset()
    assert texture_bindings(wgsl_file("attn_scores_decode")) == frozenset()
    assert texture_bindings(kernel_source("attn_ctx", "streaming")) == frozenset()


def test_bind_operands_binds_buffers_or_filled_textures(gpu):
    buf = gpu.device.create_buffer_with_data(data=np.arange(64, dtype=np.float32).tobytes(), usage=STORAGE)
    rows = Rows(buf, 4, 12, 8, 5)
    bound, fills = bind_operands(gpu.fresh, wgsl_file("attn_scores_decode"), [rows, rows, buf], "decode")
    assert bound == [buf, buf, buf] and fills == []
    bound, fills = bind_operands(gpu.fresh, wgsl_file("attn_scores_prefill"), [rows, rows, buf], "prefill")
    assert all(isinstance(b, wgpu.GPUTextureView) for b in bound[:2]) and bound[2] is buf
    assert len(fills) == 2 and all(f.label.startswith("to texture: prefill") for f in fills)


def test_rows_past_the_texture_size_are_a_typed_error(gpu):
    buf = gpu.device.create_buffer(size=4 * 16 * 9, usage=STORAGE)
    small = dataclasses.replace(gpu, limits={**gpu.limits, "max-texture-dimension-2d": 8})
    with pytest.raises(GpuLimitError, match="9 rows of 16 floats do not fit this device's 8 x 8 textures") as e:
        fill_texture(small.fresh, Rows(buf, 0, 16, 16, 9), "V")
    assert 'lab.use("attn_ctx", "tiled")' in str(e.value), str(e.value)  # 9 keys: the fast fused tier reaches them
    fill_texture(small.fresh, Rows(buf, 0, 16, 16, 8), "V")  # 8 rows fit
    with pytest.raises(GpuLimitError, match="whole vec4s"):
        fill_texture(gpu.fresh, Rows(buf, 2, 16, 16, 4), "q")


def test_a_fill_records_the_rows_it_copies_and_its_texture(gpu):
    """A fill is a dispatch of its own, which records the rows it copies and the texture it fills
    (`Dispatch.filled`): a compiled decode step keeps its matmuls' fills as recorded, so they must be
    fills of one region (X, the same rows every step); the rows of another region are another fill,
    into another texture."""
    buf = gpu.device.create_buffer(size=4 * 16 * 4, usage=STORAGE)
    rows = Rows(buf, 0, 16, 16, 1)
    view, fill = fill_texture(gpu.fresh, rows, "X")
    assert fill.filled == (rows, view) and fill.label == "to texture: X" and fill.workgroups[0] >= 1
    other_view, other = fill_texture(gpu.fresh, Rows(buf, 16, 16, 16, 1), "X")
    assert other.filled[0] != rows and other_view is not view and other.bind_group is not fill.bind_group
