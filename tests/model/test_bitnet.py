"""BitNet b1.58 (`bitnet`, as llama.cpp's build_bitnet computes it): sub-norms before the attention
output and the down projection, per-tensor weight scales, ternary weights in TQ1_0 and TQ2_0.

Tiny files written F32 by labkit's writer and quantized by llama.cpp's own quantizer go through the
GPU pass, the float64 reference and llama.cpp, stage by stage; with and without the optional
`<matrix>.scale` tensors (llama.cpp's converter bakes the scale into the weights and writes none).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from gguf.quants import dequantize

import labkit
from labkit.compare import compare
from labkit.model.gguf_file import open_gguf
from labkit.model.tiny import TinySpec, write_tiny_model
from labkit.oracle.llamacpp import coverage

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7]


def _f32(tmp_path, scales: bool):
    spec = TinySpec(arch="bitnet", weight_type="F32", embed_type="F32", seed=4, weight_scales=scales)
    return write_tiny_model(tmp_path / f"bitnet-f32-{scales}.gguf", spec, merges=["<t1> <t2>"])


def test_bitnet_graph_has_its_sub_norms_and_scales(tmp_path):
    lab = labkit.open(_f32(tmp_path, True))
    kinds = [s.split(".", 2)[2] for s in lab.stages if s.startswith("blk.0.")]
    assert kinds[kinds.index("attn_ctx") + 1 : kinds.index("attn_out") + 1] == ["attn_sub_norm", "attn_out"]
    assert kinds[kinds.index("ffn_act") + 1 : kinds.index("ffn_down") + 1] == ["ffn_sub_norm", "ffn_down"]
    assert lab.config.tied_embeddings and lab.config.weight_scales and lab.config.ffn_act == "silu"


def test_the_scale_multiplies_the_product(tmp_path):
    """q = attn_norm · Wqᵀ · s, with Wq and s read by gguf.quants, not by labkit."""
    path = _f32(tmp_path, True)
    lab, f = labkit.open(path), open_gguf(path)
    gpu, ref = lab.run(IDS), lab.reference(IDS)
    t = f.tensors["blk.0.attn_q.weight"]
    w = dequantize(np.asarray(f.raw(t.name)), t.ggml_type).reshape(t.shape).astype(np.float64)
    s = float(np.asarray(f.raw("blk.0.attn_q.scale")).view(np.float32)[0])
    assert s != 1.0
    want = np.asarray(ref["blk.0.attn_norm"], np.float64) @ w.T * s
    assert np.allclose(ref["blk.0.q"], want, rtol=1e-10, atol=1e-12)
    assert np.allclose(gpu["blk.0.q"], want, rtol=1e-4, atol=1e-4)
    assert compare(gpu, ref).passed, compare(gpu, ref).table(only_failed=True)


@needs_llama
@pytest.mark.parametrize("ftype,scales", [("TQ2_0", True), ("TQ1_0", True), ("TQ2_0", False)])
def test_ternary_files_from_llamacpp_agree_on_every_stage(tmp_path, ftype, scales):
    from labkit.oracle.quantize import quantize

    dst = quantize(_f32(tmp_path, scales), tmp_path / f"bitnet-{ftype}.gguf", ftype)
    assert {t.type_name for n, t in open_gguf(dst).tensors.items() if n.startswith("blk.0.attn_q.w")} == {ftype}
    lab = labkit.open(dst)
    _, unmapped = coverage(lab.config, lab.reference_engine.graph)
    assert not unmapped, unmapped
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    assert compare(gpu, ref).passed, compare(gpu, ref).table(only_failed=True)
    for run in (gpu, ref):
        cmp = compare(run, orc)
        assert cmp.passed and not cmp.missing, f"{run.engine} vs llama.cpp:\n{cmp.table(only_failed=True)}"
