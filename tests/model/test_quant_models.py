"""Whole models in every GGUF type: files llama.cpp's own quantizer wrote, or random valid blocks.

For each type, a tiny llama (rows of 256, so no K-quant fallback) goes through both engines and
llama.cpp: the GPU pass equals the float64 reference stage by stage, and both agree with
llama.cpp's own tensors (`lab.oracle`), with the thresholds `compare` picks by itself. llama.cpp
writes the K-quants, IQ4_NL/XS, IQ3_S and the ternary types from an F32 file without an
importance matrix, and mixes types the way its presets do (Q3_K_M, IQ3_M, Q2_K). The low-bit
I-quants and NVFP4 need an importance matrix that Python cannot pass, so those files hold random
valid blocks written with gguf's writer (QuantFormat.random_blocks); llama.cpp loads and runs them.
"""

from __future__ import annotations

import importlib.util

import pytest
from gguf import GGMLQuantizationType as Q

import labkit
from labkit.compare import compare
from labkit.model.gguf_file import open_gguf
from labkit.model.tiny import TinySpec, write_tiny_model
from labkit.oracle.quantize import quantize

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7]

# llama.cpp file type -> the tensor types its file must hold
BY_LLAMACPP = {
    "Q2_K": {"Q2_K", "Q3_K"},
    "Q3_K_M": {"Q3_K", "Q4_K", "Q5_K"},
    "Q5_1": {"Q5_1"},
    "BF16": {"BF16"},
    "IQ4_NL": {"IQ4_NL"},
    "IQ4_XS": {"IQ4_XS"},
    "IQ3_S": {"IQ3_S"},
    "IQ3_M": {"IQ3_S", "Q4_K"},
    "TQ1_0": {"TQ1_0"},
    "TQ2_0": {"TQ2_0"},
}
BY_RANDOM_BLOCKS = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "MXFP4", "NVFP4")


@pytest.fixture(scope="module")
def f32_tiny(tmp_path_factory):
    """A tiny F32 llama that llama.cpp loads (its gpt2 vocab loader wants a merge)."""
    path = tmp_path_factory.mktemp("quant") / "tiny-f32.gguf"
    return write_tiny_model(path, TinySpec(weight_type="F32", embed_type="F32", seed=3), merges=["<t1> <t2>"])


def _types(path) -> set[str]:
    return {Q(t.ggml_type).name for t in open_gguf(path).tensors.values()}


def _passes_everywhere(path) -> None:
    """GPU = reference stage by stage; both = llama.cpp's own tensors; every mapped stage compared."""
    lab = labkit.open(path)
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    cmp = compare(gpu, ref)
    assert cmp.passed, f"{path.name} GPU vs reference:\n" + cmp.table(only_failed=True)
    for run in (gpu, ref):
        cmp = compare(run, orc)
        assert cmp.passed, f"{path.name} {run.engine} vs llama.cpp:\n" + cmp.table(only_failed=True)
        assert len(cmp.rows) >= 0.9 * len(orc.captures), cmp.missing


@needs_llama
@pytest.mark.oracle
@pytest.mark.parametrize("ftype", list(BY_LLAMACPP))
def test_file_llamacpp_quantized(ftype, f32_tiny, tmp_path):
    path = quantize(f32_tiny, tmp_path / f"tiny-{ftype}.gguf", ftype)
    held = _types(path)
    assert BY_LLAMACPP[ftype] <= held, f"llama.cpp's {ftype} holds {held}"
    _passes_everywhere(path)


@needs_llama
@pytest.mark.oracle
@pytest.mark.parametrize("type_name", BY_RANDOM_BLOCKS)
def test_file_of_random_valid_blocks(type_name, tmp_path):
    spec = TinySpec(weight_type=type_name, embed_type="Q8_0", seed=5)
    path = write_tiny_model(tmp_path / f"tiny-{type_name}.gguf", spec, merges=["<t1> <t2>"])
    assert type_name in _types(path)
    _passes_everywhere(path)


@needs_llama
@pytest.mark.oracle
def test_file_of_mixed_low_bit_types(tmp_path):
    """A mix like llama.cpp's IQ2_M writes (it needs an importance matrix, so random valid blocks):
    IQ2_S matrices, IQ3_S for ffn_down, IQ4_XS for attn_v, IQ1_M for attn_q, a Q5_K embedding."""
    mix = (("ffn_down.weight", "IQ3_S"), ("attn_v.weight", "IQ4_XS"), ("attn_q.weight", "IQ1_M"))
    spec = TinySpec(weight_type="IQ2_S", embed_type="Q5_K", seed=6, type_overrides=mix)
    path = write_tiny_model(tmp_path / "tiny-iq2-mix.gguf", spec, merges=["<t1> <t2>"])
    assert {"IQ2_S", "IQ3_S", "IQ4_XS", "IQ1_M", "Q5_K"} <= _types(path)
    _passes_everywhere(path)


# the new faulty block readers: (family, variant, how the file is made)
FAULTY = [
    ("matmul_q3_k", "hmask_inverted", "Q3_K_S"),  # llama.cpp's Q3_K_S: every layer matrix Q3_K
    ("matmul_tq2_0", "no_offset", "TQ2_0"),
    ("matmul_iq2_xxs", "signs_ignored", "IQ2_XXS"),  # random valid blocks
    ("matmul_mxfp4", "e8m0_full", "MXFP4"),  # gguf.quants' MXFP4
]


@needs_llama
@pytest.mark.oracle
@pytest.mark.parametrize("family,variant,made", FAULTY, ids=[f[1] for f in FAULTY])
def test_faulty_reader_diverges_at_the_first_matmul_that_reads_it(family, variant, made, f32_tiny, tmp_path):
    if made in BY_RANDOM_BLOCKS:
        spec = TinySpec(weight_type=made, embed_type="Q8_0", seed=5)
        path = write_tiny_model(tmp_path / f"tiny-{made}.gguf", spec, merges=["<t1> <t2>"])
    else:
        path = quantize(f32_tiny, tmp_path / f"tiny-{made}.gguf", made)
    lab = labkit.open(path, variants={family: variant})
    cmp = compare(lab.run(IDS), lab.reference(IDS))
    assert cmp.first_divergence == "blk.0.q", cmp.table(only_failed=True)
    assert cmp.row("blk.0.attn_norm").passed  # everything before the first such matmul agrees
