"""RoPE scaling (linear and YaRN) as llama.cpp computes it, proven on llama.cpp's own tensors.

Real files ask for it: gpt-oss for YaRN (factor 32 over 4096 positions), Gemma 3 4B+ for linear
×8 on its global layers only, Qwen3 and Llama 3 fine-tunes for YaRN or linear. With F32 weights
llama.cpp does not quantize activations, so every stage of a tiny scaled file is the same quantity
as the float64 reference's, to 1e-5, the roped q and k included (a wrong angle, ramp or magnitude
shows there first). The Q8_0 gpt-oss file checks the GPU path too, with llama.cpp's own thresholds.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

import labkit
from labkit.compare import compare
from labkit.model.stage_kinds import KIND_ORDER
from labkit.model.tiny import TINY_MODELS, TinySpec, write_tiny_model

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]
SCALED = {  # arch -> (type, factor, original context): what the family's real files ask for
    "llama": ("linear", 4.0, 256),
    "qwen3": ("yarn", 4.0, 32),
    "gemma3": ("linear", 8.0, 256),  # the local (sliding-window) layers stay unscaled
    "gpt-oss": ("yarn", 32.0, 4096),
}


def _lab(tmp_path, arch: str, weight_type: str = "F32") -> labkit.Lab:
    tied = arch != "gpt-oss"  # llama.cpp's openai-moe wants an output.weight
    spec = TinySpec(arch=arch, weight_type=weight_type, embed_type=weight_type, seed=3, rope_scaling=SCALED[arch],
                    tied=tied)  # fmt: skip
    return labkit.open(write_tiny_model(tmp_path / f"{arch}-scaled.gguf", spec, merges=["< t"]))


def _stages(lab: labkit.Lab):
    return {s.name: s for s in lab.graph}.__getitem__


def test_the_scaling_reaches_each_layers_rope(tmp_path):
    """Gemma 3's sliding-window layers are unscaled (llama.cpp leaves rope_freq_scale_train_swa at 1);
    gpt-oss's share the file's YaRN, with the correction dims of each layer's base."""
    g3 = _stages(_lab(tmp_path, "gemma3"))
    assert g3("blk.0.q_rope").params.get("freq_scale") is None  # layer 0: local
    assert g3("blk.1.q_rope").params["freq_scale"] == 1 / 8 and g3("blk.1.q_rope").params["ext_factor"] == 0.0
    oss = _stages(_lab(tmp_path, "gpt-oss"))
    for name in ("blk.0.k_rope", "blk.1.q_rope"):
        P = oss(name).params
        assert (P["freq_scale"], P["ext_factor"], P["corr_dims"]) == (1 / 32, 1.0, (10.0, 23.0)), name


def test_a_scaled_rope_differs_from_an_unscaled_one(tmp_path):
    """The scaling is not a no-op on these prompts: the roped keys move (the test below can fail)."""
    lab = _lab(tmp_path, "gpt-oss")
    spec = TinySpec(arch="gpt-oss", weight_type="F32", embed_type="F32", seed=3, tied=False)
    plain = labkit.open(write_tiny_model(tmp_path / "plain.gguf", spec, merges=["< t"]))
    a, b = lab.reference(IDS, names=["blk.1.k_rope"]), plain.reference(IDS, names=["blk.1.k_rope"])
    assert not np.allclose(a["blk.1.k_rope"], b["blk.1.k_rope"], rtol=1e-2)


@needs_llama
@pytest.mark.parametrize("arch", sorted(SCALED))
def test_f32_scaled_file_is_llamacpps_to_1e5_at_every_stage(tmp_path, arch):
    lab = _lab(tmp_path, arch)
    orc, ref = lab.oracle(IDS), lab.reference(IDS)
    cmp = compare(ref, orc, thresholds={kind: 1e-5 for kind in KIND_ORDER})
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)


@needs_llama
def test_yarn_gpt_oss_on_the_gpu_matches_reference_and_llamacpp(tmp_path):
    """The registry's gpt-oss parts (MXFP4 experts, Q8_0 elsewhere) with a real file's YaRN: the GPU's
    roped q and k, the fused attention tiers and every later stage agree with both."""
    # seed 3: no router near-tie on this prompt. YaRN's ×1.35 on q and k sharpens attention, and on most
    # seeds llama.cpp's 8-bit activations then break a near-tie of two experts the other way at some token,
    # which moves that token's ffn_moe_out past its threshold (the F32 test above has no such noise)
    spec = dataclasses.replace(TINY_MODELS["tiny-gpt-oss"], rope_scaling=SCALED["gpt-oss"], seed=3)
    lab = labkit.open(write_tiny_model(tmp_path / "oss-yarn.gguf", spec, merges=["< t"]))
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    for a, b in ((gpu, ref), (gpu, orc), (ref, orc)):
        cmp = compare(a, b)
        assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    step = lab.generate(IDS[:6], max_new_tokens=3).ids  # decode steps rope at their own positions
    assert step == lab.generate_reference(IDS[:6], max_new_tokens=3).ids
