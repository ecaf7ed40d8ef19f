"""The fast GGUF header reader against gguf.GGUFReader, and its errors on bad files."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from labkit.errors import ModelFileError, UnsupportedArchitectureError
from labkit.model.config import config_from_metadata
from labkit.model.gguf_file import open_gguf
from labkit.model.registry import MODELS


def test_matches_gguf_reader_on_tiny(tiny_model):
    path = tiny_model("qwen2", "Q4_K")
    ours = open_gguf(path)
    theirs = GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.ggml_type == int(t.tensor_type)
        assert mine.shape == tuple(int(x) for x in reversed(t.shape))
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).view(np.uint8).ravel()), t.name
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        v = ours.metadata[key]
        expect = field.contents()
        if isinstance(v, np.ndarray):
            assert np.array_equal(v, np.asarray(expect)), key
        else:
            assert v == pytest.approx(expect) if isinstance(v, float) else v == expect, key


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_real_header_does_not_touch_weights(name):
    path = MODELS[name].locate()
    f = open_gguf(path)
    cfg = config_from_metadata(f.metadata, set(f.tensors))
    assert isinstance(f.raw("token_embd.weight"), np.memmap)
    last = max(f.tensors.values(), key=lambda t: t.offset)
    assert last.offset + last.nbytes <= path.stat().st_size
    # the tiny ones labkit writes: 4 layers, Nemotron-H's 5 (its FFNs are layers of their own)
    assert cfg.n_layers == {"gemma3-270m": 18, "smollm2-135m": 30, "tiny-nemotron_h": 5, "tiny-deepseek2": 3}.get(
        name, 4
    )


def test_gemma_config(gemma):
    c = gemma.config
    assert (c.arch, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "gemma3",
        18,
        640,
        4,
        1,
        256,
    )
    assert c.sliding_window == 512 and c.swa_layers.count(False) == 3 and not c.swa_layers[5]
    assert (c.rope_base, c.rope_base_local, c.rope_style) == (1e6, 1e4, "neox")
    assert c.tied_embeddings and c.qk_norm and c.sandwich_norms and c.ffn_act == "gelu_tanh"
    assert c.embed_scale == pytest.approx(640**0.5) and c.vocab_size == 262144
    assert (c.bos_id, c.add_bos) == (2, True)


def test_smollm_config(smollm):
    c = smollm.config
    assert (c.arch, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "llama",
        30,
        576,
        9,
        3,
        64,
    )
    assert (c.rope_base, c.rope_style, c.sliding_window) == (100000.0, "normal", None)
    assert c.tied_embeddings and not c.qk_norm and c.ffn_act == "silu" and not c.add_bos


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        open_gguf(tmp_path / "nope.gguf")


def test_bad_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ModelFileError, match="magic"):
        open_gguf(p)


def test_truncated_header_and_data(tiny_model, tmp_path):
    src = tiny_model("llama", "Q8_0").read_bytes()
    for cut, msg in ((64, "truncated"), (len(src) - 100, "truncated file")):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(src[:cut])
        with pytest.raises(ModelFileError, match=msg):
            open_gguf(p)


def test_unsupported_architecture(tmp_path):
    from gguf import GGUFWriter

    p = tmp_path / "mamba.gguf"
    w = GGUFWriter(str(p), "mamba")
    w.add_block_count(1)
    w.add_tensor("x", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = open_gguf(p)
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        config_from_metadata(f.metadata, set(f.tensors))


def test_file_unchanged_after_open(tiny_model):
    p = tiny_model("gemma3", "Q5_0")
    before = (p.stat().st_mtime_ns, p.read_bytes())
    open_gguf(p).raw("token_embd.weight")
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before
