"""gpt-oss (llama.cpp's openai-moe graph) on both engines and against llama.cpp.

The registry's tiny-gpt-oss (labkit's writer: MXFP4 experts, Q8_0 elsewhere) has every part that
sets the family apart: a sink logit per head in every attention softmax, sliding-window layers
(even ones) beside full ones, biases on q/k/v, the output, the router and every expert (ggml's
add_id), a top k of the router's logits with a softmax over the k, and the clamped SwiGLU. Every
stage agrees with the float64 reference and with llama.cpp's own tensors, the ids exactly; the
router faults localize at the layer they are bound to.
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
from labkit.model.gguf_file import open_gguf
from labkit.model.tiny import TINY_MODELS, write_tiny_model
from labkit.oracle.llamacpp import coverage
from labkit.oracle.quantize import quantize

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]
SPEC = TINY_MODELS["tiny-gpt-oss"]
N_LAYERS = SPEC.n_layers


@pytest.fixture(scope="module")
def oss():
    return labkit.open("tiny-gpt-oss")


@pytest.fixture(scope="module")
def oss_runs(oss):
    return oss.run(IDS), oss.reference(IDS)


def test_the_graph_is_gpt_oss(oss):
    """No probabilities stage (the top k are the logits'), sinks on the softmax and the fused
    tiers' stage, even layers windowed, biases where llama.cpp's openai-moe reads them."""
    cfg = oss.config
    assert cfg.swa_layers == (True, False, True, False) and cfg.sliding_window == SPEC.sliding_window
    assert cfg.expert_gating == "softmax_weight" and not cfg.expert_weights_norm
    graph = {s.name: s for s in oss.reference_engine.graph}
    kinds = [n.split(".", 2)[2] for n in graph if n.startswith("blk.0.")]
    moe = ["ffn_router", "ffn_topk", "ffn_expert_weights", "ffn_moe_gate", "ffn_moe_up", "ffn_moe_act",
           "ffn_moe_down", "ffn_moe_out"]  # fmt: skip
    assert kinds[kinds.index("ffn_norm") + 1 : kinds.index("resid_out")] == moe
    assert graph["blk.0.ffn_norm"].weight == "blk.0.post_attention_norm.weight"
    for name in ("blk.1.attn_probs", "blk.1.attn_ctx"):
        assert graph[name].tensors["sinks"] == "blk.1.attn_sinks.weight"
    for name, bias in (("blk.2.attn_out", "attn_output"), ("blk.2.ffn_router", "ffn_gate_inp"),
                       ("blk.2.ffn_moe_down", "ffn_down_exps"), ("blk.2.q", "attn_q")):  # fmt: skip
        assert graph[name].bias == f"blk.2.{bias}.bias"
    assert graph["blk.0.attn_scores"].params["window"] == SPEC.sliding_window
    assert graph["blk.1.attn_scores"].params["window"] is None
    assert oss.gguf.tensors["blk.0.ffn_up_exps.weight"].type_name == "MXFP4"


def test_gpu_equals_reference(oss_runs):
    gpu, ref = oss_runs
    cmp = compare(gpu, ref)
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    for L in range(N_LAYERS):
        assert np.array_equal(gpu[f"blk.{L}.ffn_topk"], ref[f"blk.{L}.ffn_topk"])
        w = gpu[f"blk.{L}.ffn_expert_weights"]
        assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6), "a softmax over the k selected logits sums to 1"


def test_stepping_gives_the_batched_captures(oss, oss_runs):
    """Stage by stage (the stepper), every capture is bit-identical to the batched pass's, the
    integer expert ids too."""
    gpu, _ = oss_runs
    st = oss.step(IDS)
    while not st.done:
        st.next()
    assert set(st.captures) == set(gpu.captures)
    for name in gpu.captures:
        assert gpu[name].tobytes() == st[name].tobytes(), f"{name}: stepped and batched differ"


def test_the_sinks_take_a_share_of_every_attention_row(oss, oss_runs):
    """Each row of attn_probs sums to 1 minus the sink's share, exp(sink - m) / Z, computed here
    from the scores and the file's sink logits."""
    gpu, _ = oss_runs
    for L in range(N_LAYERS):
        sinks = oss.gguf.raw(f"blk.{L}.attn_sinks.weight").view(np.float32).astype(np.float64).reshape(-1, 1)
        s = np.asarray(gpu[f"blk.{L}.attn_scores"], np.float64)
        m = np.maximum(s.max(axis=-1), sinks)
        share = np.exp(sinks - m) / (np.exp(s - m[..., None]).sum(axis=-1) + np.exp(sinks - m))
        rows = np.asarray(gpu[f"blk.{L}.attn_probs"], np.float64).sum(axis=-1)
        assert np.allclose(rows, 1.0 - share, atol=1e-5), f"layer {L}: max diff {np.abs(rows - 1 + share).max()}"


@pytest.mark.parametrize("tier", ["streaming", "tiled"])
def test_fused_attention_tiers_have_the_sinks(oss, oss_runs, tier):
    """The fused tiers never materialize the probabilities: their context must still carry the sink."""
    _, ref = oss_runs
    run = labkit.open("tiny-gpt-oss").use("attn_ctx", tier).run(IDS)
    cmp = compare(run, ref)
    assert cmp.passed, cmp.table(only_failed=True)


def test_decode_steps_match_the_prefill(oss):
    """KV-cached decode steps (one token each, the decode kernels with sinks and a window) give the
    prefill's last logits and route as it does; greedy generation equals the reference's."""
    step = oss.decode_step(IDS)
    full = oss.run(IDS)
    assert np.array_equal(step["blk.2.ffn_topk"][-1], full["blk.2.ffn_topk"][-1])
    assert np.allclose(step["logits"][-1], full["logits"][-1], atol=1e-4)
    assert oss.generate(IDS, max_new_tokens=4).ids == oss.generate_reference(IDS, max_new_tokens=4).ids


@needs_llama
def test_both_engines_agree_with_llamacpp_on_every_stage(oss, oss_runs):
    orc = oss.oracle(IDS)
    mapped, unmapped = coverage(oss.config, oss.reference_engine.graph)
    assert not unmapped and len(mapped) == len(oss.reference_engine.graph), unmapped
    for run in oss_runs:
        cmp = compare(run, orc)  # no thresholds=: the int8-activation table compare picks
        assert cmp.passed and not cmp.missing, f"{run.engine} vs llama.cpp:\n{cmp.table(only_failed=True)}"
    for L in range(N_LAYERS):  # the experts each token goes to, exactly, in llama.cpp's order
        got, want = oss_runs[0][f"blk.{L}.ffn_topk"], orc[f"blk.{L}.ffn_topk"]
        assert np.array_equal(got, want), f"layer {L}: labkit {got.tolist()} vs llama.cpp {want.tolist()}"


@needs_llama
def test_a_file_quantized_by_llamacpp_passes(tmp_path):
    """llama.cpp's MXFP4_MOE of an F32 gpt-oss (what its converter makes of OpenAI's checkpoint):
    MXFP4 experts from llama.cpp's own quantizer, Q8_0 attention, F32 router, sinks and biases."""
    f32 = dataclasses.replace(SPEC, weight_type="F32", embed_type="F32", type_overrides=())
    src = write_tiny_model(tmp_path / "oss-f32.gguf", f32, merges=["<t1> <t2>"])
    dst = quantize(src, tmp_path / "oss-mxfp4.gguf", "MXFP4_MOE")
    tensors = open_gguf(dst).tensors
    assert {t.type_name for n, t in tensors.items() if n.endswith("_exps.weight")} == {"MXFP4"}
    assert tensors["blk.0.attn_sinks.weight"].type_name == "F32"
    lab = labkit.open(dst)
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    assert compare(gpu, ref).passed, compare(gpu, ref).table(only_failed=True)
    for run in (gpu, ref):
        cmp = compare(run, orc)
        assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)


@needs_llama
def test_a_near_tie_of_router_logits_is_reported_as_a_tie(tmp_path):
    """Seed 13 has a token whose 4th and 5th experts are closer in logit than llama.cpp's 8-bit
    activations and labkit's float32 agree there: llama.cpp picks the other one. compare names it a
    near-tie (judged on the softmax of the logits: gpt-oss has no probabilities stage) and passes."""
    path = write_tiny_model(tmp_path / "oss13.gguf", dataclasses.replace(SPEC, seed=13), merges=["<t1> <t2>"])
    lab = labkit.open(path)
    gpu, orc = lab.run(IDS), lab.oracle(IDS)
    swapped = [L for L in range(N_LAYERS) if any(set(a) != set(b) for a, b in
               zip(gpu[f"blk.{L}.ffn_topk"].tolist(), orc[f"blk.{L}.ffn_topk"].tolist()))]  # fmt: skip
    assert swapped, "the tie this test is about is gone"
    cmp = compare(gpu, orc)
    assert cmp.passed, cmp.table(only_failed=True)
    assert "near-tie" in cmp.row(f"blk.{swapped[0]}.ffn_topk").reason


# fault -> the stage kind where it first shows on gpt-oss (None: the model's own order)
FAULT_SHOWS_AT = {
    "expert_index_off_by_one": "ffn_topk",
    "softmax_before_topk": "ffn_expert_weights",
    "softmax_after_topk": None,
    "no_renormalize": None,
}


@pytest.mark.parametrize("fault", sorted(FAULT_SHOWS_AT))
def test_a_router_fault_bound_to_one_layer_shows_at_that_layer(oss_runs, fault):
    _, ref = oss_runs
    faulty = labkit.open("tiny-gpt-oss").use("blk.2.moe_router", fault).run(IDS)
    cmp = compare(faulty, ref)
    where = FAULT_SHOWS_AT[fault]
    if where is None:  # gpt-oss takes the softmax after the top k and does not renormalize
        assert cmp.passed, cmp.table(only_failed=True)
        return
    assert cmp.first_divergence == f"blk.2.{where}", cmp.table(only_failed=True)
    assert all(r.passed for r in cmp.rows if r.stage.startswith(("blk.0.", "blk.1."))), "layers 0-1 untouched"
    if fault == "softmax_before_topk":  # the same experts, weights that no longer sum to 1
        assert np.array_equal(faulty["blk.2.ffn_topk"], ref["blk.2.ffn_topk"])
        assert np.all(faulty["blk.2.ffn_expert_weights"].sum(axis=1) < 0.999)


def test_the_memory_plan_counts_sinks_and_expert_biases(oss):
    """Sinks and the experts' biases are tensors both engines hold: the plans count them."""
    plan = oss.memory(tokens=16)
    part = {(p.engine, p.part): p.nbytes for p in plan.parts}
    small = [t for n, t in oss.gguf.tensors.items() if n.endswith(("attn_sinks.weight", "_exps.bias"))]
    experts = [t for n, t in oss.gguf.tensors.items() if n.endswith("_exps.weight")]
    held = sum(t.nbytes for t in experts) + sum(4 * int(np.prod(t.shape)) for t in small)
    assert part["gpu", "weights"] >= held


def test_router_figures_show_the_softmax_of_the_logits(oss_runs):
    """gpt-oss has no probabilities stage: the router map shows the softmax of its logits."""
    from labkit.viz import figures, static

    gpu, _ = oss_runs
    fig = figures.router_map(gpu, 1)
    heat = next(t for t in fig.data if t.type == "heatmap")
    assert np.allclose(np.asarray(heat.z, float).sum(axis=1), 1.0) and "softmax of the logits" in fig.layout.title.text
    assert static.router_map(gpu, 1) is not None


def test_rope_scaling_is_read_not_ignored():
    """A real gpt-oss file asks for YaRN (factor 32 over 4096 positions): labkit reads it as llama.cpp
    does (labkit.model.config.RopeScaling; tests/model/test_rope_scaling.py checks it against llama.cpp), and a
    scaling it does not compute (longrope's per-dim factors) is refused, never run unscaled."""
    meta = {"general.architecture": "gpt-oss", "gpt-oss.block_count": 2, "gpt-oss.embedding_length": 64,
            "gpt-oss.attention.head_count": 2, "gpt-oss.feed_forward_length": 64, "gpt-oss.expert_count": 4,
            "gpt-oss.expert_used_count": 2, "gpt-oss.expert_feed_forward_length": 64,
            "gpt-oss.attention.sliding_window": 128, "gpt-oss.rope.scaling.type": "yarn",
            "gpt-oss.rope.scaling.factor": 32.0, "gpt-oss.rope.scaling.original_context_length": 4096}  # fmt: skip
    sc = config_from_metadata(meta, set()).rope_scaling
    assert (sc.kind, sc.freq_scale, sc.ext_factor, sc.n_ctx_orig) == ("yarn", 1 / 32, 1.0, 4096)
    assert sc.attn_factor == pytest.approx(1.0), "get_mscale(32) cancelled: the kernel multiplies 1 + 0.1 ln 32 in"
    meta["gpt-oss.rope.scaling.type"] = "longrope"
    with pytest.raises(UnsupportedArchitectureError, match="longrope"):
        config_from_metadata(meta, set())
    meta["gpt-oss.rope.scaling.type"], meta["gpt-oss.rope.scaling.factor"] = "linear", 1.0  # BitNet's converter
    assert not config_from_metadata(meta, set()).rope_scaling.scales
