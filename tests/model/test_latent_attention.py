"""DeepSeek's latent attention and routing (deepseek2), on tiny-deepseek2: a q-LoRA, a leading dense layer,
then sigmoid-routed mixtures in expert groups with a routed scale, beside a shared expert.

The absorbed form equals the multi-head form on the reference; the GPU equals the reference at every
stage; a decode step equals the prompt's last row; the cache holds the latent and the rotary key;
llama.cpp's own tensors agree at every stage, its expert ids per token, its greedy continuations.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import labkit
from labkit import compare
from labkit.errors import HyperparameterError, UnsupportedArchitectureError
from labkit.model.latent_attention import naive_attention
from labkit.oracle.llamacpp import coverage

from conftest import compare_with_fault_at, llamacpp_greedy

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / np.sum(b**2))


@pytest.fixture(scope="module")
def ds():
    return labkit.open("tiny-deepseek2")


@pytest.fixture(scope="module")
def ds_runs(ds):
    return ds.run(IDS), ds.reference(IDS)


def test_the_graph_is_deepseeks():
    lab = labkit.open("tiny-deepseek2")
    cfg, kinds = lab.config, [s.kind for s in lab.graph if s.layer == 1]
    assert (cfg.mla.q_lora, cfg.mla.kv_lora, cfg.mla.nope, cfg.mla.rope, cfg.mla.v_head) == (64, 64, 32, 32, 32)
    assert cfg.moe_layers == (False, True, True) and cfg.d_ff_shexp == 256
    assert (cfg.expert_gating, cfg.expert_groups, cfg.expert_groups_used, cfg.expert_weights_scale) == (
        "sigmoid", 4, 2, 2.5)  # fmt: skip
    # YaRN: the rotation's magnitude cancelled, mscale² in the softmax scale (llama.cpp's deepseek2)
    mscale = 1 + 0.1 * 0.707 * np.log(4.0)
    assert cfg.attn_scale == pytest.approx(mscale**2 / 8, rel=1e-6)
    assert cfg.rope_scaling.attn_factor * (1 + 0.1 * np.log(4.0)) == pytest.approx(1.0)
    for kind in ("q_a", "q_a_norm", "kv_latent", "kv_latent_norm", "q_absorbed", "k_mla", "attn_ctx_latent"):
        assert kind in kinds
    k_mla = next(s for s in lab.graph if s.name == "blk.1.k_mla")
    assert k_mla.kv_write == "k" and cfg.cache_dims == (96, 64)


def test_gpu_equals_reference_on_every_stage(ds_runs):
    gpu, ref = ds_runs
    c = compare(gpu, ref)
    assert c.passed and not c.missing, c
    worst = {n: nmse(gpu[n], ref[n]) for n in ref.captures if "attn_scores" not in n and "topk" not in n}
    assert max(worst.values()) < 1e-10, sorted(worst.items(), key=lambda kv: -kv[1])[:3]


def test_absorption_is_exact_on_the_reference(ds, ds_runs):
    """The multi-head form (K and V up-projected per head) against the absorbed one labkit runs."""
    _, ref = ds_runs
    for L in range(ds.config.n_layers):
        naive = naive_attention(ref.captures, ds.reference_engine.weight, ds.config, L)
        for kind in ("attn_scores", "attn_ctx"):
            got, want = ref[f"blk.{L}.{kind}"], naive[kind]
            fin = np.isfinite(want)
            assert np.array_equal(fin, np.isfinite(got))
            rel = np.abs(got[fin] - want[fin]).max() / np.abs(want[fin]).max()
            assert rel < 1e-12, (L, kind, rel)


def test_a_decode_step_equals_the_prompts_last_row(ds, ds_runs):
    _, ref = ds_runs
    for engine in ("gpu", "reference"):
        step = ds.decode_step(IDS, engine=engine)
        for name in ("blk.2.k_mla", "blk.2.attn_ctx_latent", "blk.2.ffn_topk", "logits"):
            assert nmse(step[name][-1:], ref[name][-1:]) < 1e-10, (engine, name)


def test_generate_on_the_gpu_follows_the_reference(ds):
    assert ds.generate(IDS[:5], max_new_tokens=6).ids == ds.generate_reference(IDS[:5], max_new_tokens=6).ids


def test_the_cache_holds_the_latent_not_every_heads_k_and_v(ds):
    """96 + 64 floats a token and layer (the latent and the rotary key; the latent again as the values), where
    a multi-head cache of the same heads holds 4 x (64 + 32); the memory plan at 32k tokens counts that."""
    cfg = ds.config
    per_token = sum(cfg.cache_dims)
    full = cfg.n_heads * (cfg.mla.k_head + cfg.mla.v_head)
    assert per_token == 160 and full == 384
    plan = ds.memory(tokens=32768, capture=[], engine="gpu")
    kv = next(p for p in plan.parts if p.engine == "gpu" and p.part == "kv cache")
    assert kv.nbytes == 3 * 32768 * per_token * 4


@needs_llama
def test_every_stage_agrees_with_llamacpp(ds, ds_runs):
    """llama.cpp's deepseek2 graph (MLA absorbed, its f16 latent cache, Q8 activations): every stage mapped
    and within the int8 column; its expert ids equal the reference's on every token but a near-tie."""
    mapped, unmapped = coverage(ds.config, ds.graph)
    assert not unmapped, unmapped
    oracle = ds.oracle(IDS)
    c = compare(oracle, ds.reference(IDS, route_as=oracle))
    assert c.passed and not c.missing, c
    for L in (1, 2):
        own, theirs = np.sort(ds_runs[1][f"blk.{L}.ffn_topk"], 1), np.sort(oracle[f"blk.{L}.ffn_topk"], 1)
        assert np.sum(np.any(own != theirs, axis=1)) <= 1, L


@needs_llama
def test_greedy_continuations_equal_llamacpps(ds):
    for prompt in (IDS[:6], IDS[4:]):
        assert ds.generate(prompt, max_new_tokens=8).ids == llamacpp_greedy(ds.path, prompt, 8)


def _meta_file(tmp_path, drop: str = "", **changes):
    """tiny-deepseek2's file with a key dropped or changed (the struct-level writer keeps the rest)."""
    from gguf_struct import U32, read_layout, scalar

    data = labkit.open("tiny-deepseek2").path.read_bytes()
    layout, _ = read_layout(data)
    if drop:
        layout = layout.drop_key(drop)
    for key, value in changes.items():
        layout = layout.set(key, scalar(U32, value))
    path = tmp_path / "ds.gguf"
    path.write_bytes(layout.to_bytes())
    return path


@pytest.mark.parametrize("drop, changes, error, fragment", [
    ("deepseek2.attention.key_length_mla", {}, UnsupportedArchitectureError, "legacy file with one attn_kv_b"),
    ("", {"deepseek2.attention.key_length": 64}, HyperparameterError, "an MLA file's is 96"),
    ("", {"deepseek2.rope.dimension_count": 64}, HyperparameterError, "leaves no unrotated part"),
    ("", {"deepseek2.expert_group_count": 3}, HyperparameterError, "must divide"),
    ("", {"deepseek2.expert_gating_func": 4}, UnsupportedArchitectureError, "expert_gating_func 4"),
])  # fmt: skip
def test_a_deepseek_file_labkit_cannot_run_is_refused_by_name(tmp_path, drop, changes, error, fragment):
    with pytest.raises(error, match=fragment):
        labkit.open(_meta_file(tmp_path, drop, **changes))


@pytest.mark.parametrize("variant, first", [
    ("rope=neox_pairs", "blk.1.q_pe_rope"),
    ("rope=yarn_uncancelled", "blk.1.q_pe_rope"),
    ("columns=rotary_first", "blk.1.k_pe"),
    ("moe_router=groups_ignored", "blk.2.ffn_topk"),
    ("moe_router=no_routed_scale", "blk.1.ffn_expert_weights"),
    ("moe_router=routed_scale_twice", "blk.2.ffn_expert_weights"),
])  # fmt: skip
def test_a_deepseek_fault_bound_to_one_layer_is_localized_there(ds, variant, first):
    """On one prompt pass, at the faulty layer's stage and nowhere before it."""
    c = compare_with_fault_at(ds, variant, first, IDS)
    assert c.first_divergence == first, c


def test_blind_cases_draw_from_the_deepseek_faults(ds):
    from labkit.casebook.blind import blind_case_of, candidates

    drawn = set(candidates(ds))
    assert {("moe_router", "groups_ignored"), ("moe_router", "no_routed_scale"), ("rope", "yarn_uncancelled"),
            ("rope", "neox_pairs"), ("columns", "rotary_first")} <= drawn  # fmt: skip
    answer = blind_case_of(ds, "moe_router", "no_routed_scale").reveal()
    assert (answer.stage, answer.family) == ("blk.1.ffn_expert_weights", "moe_router")


def test_absorbed_queries_too_wide_for_a_texture_are_scored_from_a_buffer(ds):
    """DeepSeek-V3's absorbed queries are 128 heads of 576 values, 18432 texels a row, past WebGPU's 8192 (and
    lavapipe's 16384): the scores default to the buffer kernel there; tiny-deepseek2's keep the prefill kernel."""
    from dataclasses import replace

    from labkit.gpu.kernel_selection import choose

    tiny = next(s for s in ds.graph if s.name == "blk.1.attn_scores")
    wide = replace(tiny, params={**tiny.params, "n_heads": 128, "head_dim": 576})
    assert choose(tiny, "attn_scores", {}, "cpu", "blocks").kernel.name == "default"
    got = choose(wide, "attn_scores", {}, "cpu", "blocks")
    assert got.kernel.name == "general" and "18432 texels" in got.why
    assert choose(wide, "attn_scores", {"attn_scores": "decode_uses_prefill"}, "cpu", "blocks").kernel.faulty
