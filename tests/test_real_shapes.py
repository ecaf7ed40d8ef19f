"""Real widths: random-weight files with the public shapes of Qwen2.5-0.5B, Llama-3.2-1B, 3B and
Llama-3.1-8B (2 of their layers, so CI stays fast), stored as llama.cpp's Q4_K_M stores them.
Each runs on the GPU path and in the streaming float64 reference, and both are checked against
each other and against llama.cpp's own tensors of the same file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

import labkit
from labkit.model.gguf_file import open_gguf
from labkit.model.shaped import SHAPES, write_shaped_model

TOKENS = [17, 4242, 99, 1000, 31337, 5, 64000, 12, 777, 2048, 3, 100000, 8, 65, 4096, 250]
# the 8B shape runs its reference under a small budget: its 128256 x 4096 output weight (2.1 GB as
# float32) does not fit, so the reference streams it in row chunks
BUDGETS = {"llama-3.1-8b": "2GB"}


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    made: dict[str, object] = {}

    def make(name: str):
        if name not in made:
            made[name] = write_shaped_model(tmp_path_factory.mktemp("shaped") / f"{name}.gguf", name, n_layers=2)
        return made[name]

    return make


@pytest.mark.parametrize("name", list(SHAPES))
def test_shaped_file_has_the_public_shape_and_q4_k_m_types(shaped, name):
    shape, f = SHAPES[name], open_gguf(shaped(name))
    T = GGMLQuantizationType
    q = f.tensors["blk.0.attn_q.weight"]
    assert q.shape == (shape.n_heads * shape.head_dim, shape.d_model)
    assert f.tensors["blk.1.ffn_down.weight"].shape == (shape.d_model, shape.d_ff)
    assert f.tensors["token_embd.weight"].shape == (shape.vocab, shape.d_model)
    k_quants = shape.d_model % 256 == 0
    assert q.ggml_type == (T.Q4_K if k_quants else T.Q5_0)  # llama.cpp's fallback for 896-wide rows
    assert f.tensors["blk.0.attn_v.weight"].ggml_type == (T.Q6_K if k_quants else T.Q8_0)
    assert f.tensors["blk.0.ffn_down.weight"].ggml_type == T.Q6_K  # 4864, 8192, 14336: whole blocks
    # weights near GAIN / sqrt(cols), mean near zero: activations stay in range through every layer
    w = dequantize(f.raw("blk.0.ffn_up.weight")[:64], f.tensors["blk.0.ffn_up.weight"].ggml_type)
    assert 0.3 < w.std() * np.sqrt(shape.d_model) < 1.5 and abs(w.mean()) < 0.2 * w.std(), (w.std(), w.mean())


@pytest.mark.parametrize("name", list(SHAPES))
def test_gpu_reference_and_llamacpp_agree_at_real_width(shaped, name):
    lab = labkit.open(shaped(name), memory=BUDGETS.get(name))
    ref = lab.reference(TOKENS)
    run = lab.run(TOKENS)
    cmp = labkit.compare(run, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    orc = lab.oracle(TOKENS)
    cmp = labkit.compare(orc, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    assert int(np.argmax(orc["logits"][-1])) == int(np.argmax(ref["logits"][-1]))
    if name in BUDGETS:  # the output weight was streamed, never held whole
        cache = lab.reference_engine.weights
        assert "output.weight" not in cache and cache.nbytes <= lab.budget.nbytes, cache.nbytes
