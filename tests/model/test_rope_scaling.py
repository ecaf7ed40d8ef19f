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
from labkit.errors import UnsupportedArchitectureError
from labkit.model.config import config_from_metadata
from labkit.model.stage_kinds import KIND_ORDER
from labkit.model.tiny import TINY_MODELS, TinySpec, write_tiny_model
from labkit.ops.rope import rope

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]
SCALED = {  # arch -> (type, factor, original context): what the family's real files ask for
    "llama": ("linear", 4.0, 256),
    "qwen3": ("yarn", 4.0, 32),
    "gemma3": ("linear", 8.0, 256),  # the local (sliding-window) layers stay unscaled
    "gpt-oss": ("yarn", 32.0, 4096),
}


def _lab(tmp_path, arch: str, weight_type: str = "F32", **kw) -> labkit.Lab:
    tied = arch != "gpt-oss"  # llama.cpp's openai-moe wants an output.weight
    spec = TinySpec(arch=arch, weight_type=weight_type, embed_type=weight_type, seed=3, rope_scaling=SCALED[arch],
                    tied=tied, **kw)  # fmt: skip
    return labkit.open(write_tiny_model(tmp_path / f"{arch}-scaled.gguf", spec, merges=["<t1> <t2>"]))


def _stages(lab: labkit.Lab):
    return {s.name: s for s in lab.graph}.__getitem__


def test_the_scaling_reaches_each_layers_rope(tmp_path):
    """Gemma 3's sliding-window layers are unscaled (llama.cpp leaves rope_freq_scale_train_swa at 1);
    gpt-oss's share the file's YaRN, with the correction dims of the layers' base."""
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
    plain = labkit.open(write_tiny_model(tmp_path / "plain.gguf", spec, merges=["<t1> <t2>"]))
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
    lab = labkit.open(write_tiny_model(tmp_path / "oss-yarn.gguf", spec, merges=["<t1> <t2>"]))
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    for a, b in ((gpu, ref), (gpu, orc), (ref, orc)):
        cmp = compare(a, b)
        assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    step = lab.generate(IDS[:6], max_new_tokens=3).ids  # decode steps rope at their own positions
    assert step == lab.generate_reference(IDS[:6], max_new_tokens=3).ids


def test_scaled_angles_follow_ggml_rope_yarn_written_out():
    """ggml's rope_yarn, written out here for one pair below the ramp, one in it and one above, on
    gpt-oss's numbers (factor 32, correction dims 10..23): the fast pairs keep their angle, the slow
    ones are divided by 32, cos and sin grow by 1 + 0.1·ln 32; rope_freqs divides the angle first."""
    pos, base, d = 1000, 1.5e5, 64
    x = np.zeros((1, d))
    pairs = (4, 16, 30)
    for i in pairs:
        x[0, i], x[0, i + d // 2] = 1.0, 0.0  # neox pair (i, i + d/2): rotating (1, 0) gives m·(cos, sin)
    factors = np.linspace(1.0, 4.0, d // 2)
    scaling = {"freq_scale": 1 / 32, "ext_factor": 1.0, "attn_factor": 1.0, "corr_dims": (10.0, 23.0)}
    got = rope(x, np.array([pos]), 1, d, d, base, "neox", scaling=scaling, freq_factors=factors)[0]
    m = 1 + 0.1 * np.log(32)
    for i in pairs:
        extrap = pos * base ** (-2 * i / d) / factors[i]
        mix = 1 - min(1.0, max(0.0, (i - 10) / 13))  # 1 below the ramp, 0 above it
        theta = extrap / 32 * (1 - mix) + extrap * mix
        np.testing.assert_allclose([got[i], got[i + d // 2]], [m * np.cos(theta), m * np.sin(theta)], atol=1e-12)


def _meta(**rope) -> dict:
    a = "llama"
    meta = {"general.architecture": a, f"{a}.block_count": 2, f"{a}.embedding_length": 64,
            f"{a}.attention.head_count": 2, f"{a}.feed_forward_length": 64, f"{a}.context_length": 2048}  # fmt: skip
    return meta | {f"{a}.rope.{k}": v for k, v in rope.items()}


def test_the_metadata_is_read_as_llamacpp_reads_it():
    """The type defaults to linear; the old scale_linear key stands in for the factor; YaRN's log
    multiplier and the file's attn_factor enter the magnitude as llama_context computes it; a
    scaling labkit does not compute is refused."""
    sc = config_from_metadata(_meta(**{"scaling.factor": 4.0}), set()).rope_scaling
    assert (sc.kind, sc.freq_scale, sc.ext_factor, sc.attn_factor) == ("linear", 0.25, 0.0, 1.0) and sc.scales
    assert config_from_metadata(_meta(scale_linear=2.0), set()).rope_scaling.freq_scale == 0.5
    assert not config_from_metadata(_meta(**{"scaling.type": "none", "scaling.factor": 4.0}), set()).rope_scaling.scales
    attn = config_from_metadata(_meta(**{"scaling.type": "none", "scaling.attn_factor": 0.5}), set()).rope_scaling
    assert attn.attn_factor == 0.5 and attn.scales, "llama.cpp multiplies rope_attn_factor in whatever the type"
    yarn = {"scaling.type": "yarn", "scaling.factor": 40.0, "scaling.yarn_log_multiplier": 0.1}
    sc = config_from_metadata(_meta(**yarn), set()).rope_scaling
    want = (
        1.0 / (0.1 * 0.1 * np.log(40) + 1.0) / (1 + 0.1 * np.log(40))
    )  # get_mscale(40, 1)/get_mscale(40, 0.1) cancelled
    assert sc.n_ctx_orig == 2048 and sc.attn_factor == pytest.approx((0.1 * np.log(40) + 1) * want)
    with pytest.raises(UnsupportedArchitectureError, match="longrope"):
        config_from_metadata(_meta(**{"scaling.type": "longrope", "scaling.factor": 4.0}), set())
    with pytest.raises(UnsupportedArchitectureError, match="rope_factors_long"):
        config_from_metadata(_meta(), {"rope_factors_long.weight", "rope_factors_short.weight"})


@needs_llama
def test_llama3_rope_freqs_match_llamacpp(tmp_path):
    """Llama 3.1/3.2 files divide each pair's angle by rope_freqs.weight (the llama3 scaling, written
    by the converter): with F32 weights every stage is llama.cpp's to 1e-5, and the GPU equals the
    reference; the factors move the keys (without them the test could not fail)."""
    lab = _lab(tmp_path, "llama", rope_freq_factors=True)
    assert lab.config.rope_freq_factors == "rope_freqs.weight"
    assert {s.name: s for s in lab.graph}["blk.1.k_rope"].tensors["freq_factors"] == "rope_freqs.weight"
    orc, ref, gpu = lab.oracle(IDS), lab.reference(IDS), lab.run(IDS)
    cmp = compare(ref, orc, thresholds={kind: 1e-5 for kind in KIND_ORDER})
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    cmp = compare(gpu, ref)
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    (tmp_path / "plain").mkdir()
    plain = _lab(tmp_path / "plain", "llama").reference(IDS, names=["blk.1.k_rope"])
    assert not np.allclose(plain["blk.1.k_rope"], ref["blk.1.k_rope"], rtol=1e-2)
