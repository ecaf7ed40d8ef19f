"""ERNIE 4.5 MoE (llama.cpp's ernie4_5-moe graph) on both engines and against llama.cpp.

The registry's tiny-ernie4_5-moe (labkit's writer, Q8_0) has what sets the family apart: a leading
dense layer, then MoE layers whose shared experts' FFN is added to the mixture, and a router with a
selection-only bias (`exp_probs_b`): the top k rank the probabilities plus the bias, the weights are
the probabilities alone. That bias is what the `bias_in_weights` router fault gets wrong, so this is
the family that fault is proven on.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

import labkit
from labkit.compare import compare
from labkit.errors import ModelFileError, UnsupportedArchitectureError
from labkit.model.config import config_from_metadata
from labkit.model.stage_kinds import KIND_ORDER
from labkit.model.tiny import TINY_MODELS, write_tiny_model
from labkit.ops.moe_router import softmax_rows, top_k
from labkit.oracle.llamacpp import coverage

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]
SPEC = TINY_MODELS["tiny-ernie4_5-moe"]
MOE_LAYERS = range(SPEC.n_dense_lead, SPEC.n_layers)


@pytest.fixture(scope="module")
def ernie():
    return labkit.open("tiny-ernie4_5-moe")


@pytest.fixture(scope="module")
def ernie_runs(ernie):
    return ernie.run(IDS), ernie.reference(IDS)


def test_the_graph_is_ernie(ernie):
    """Layer 0 is a dense FFN; the others route, add the shared experts, and rank with exp_probs_b."""
    cfg = ernie.config
    assert cfg.moe_layers == (False, True, True, True) and cfg.d_ff_shexp == SPEC.d_ff_shexp
    assert cfg.expert_selection_bias and cfg.expert_weights_norm and cfg.rope_style == "normal"
    graph = {s.name: s for s in ernie.graph}
    dense = [n.split(".", 2)[2] for n in graph if n.startswith("blk.0.ffn")]
    assert dense == ["ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down"]
    kinds = [n.split(".", 2)[2] for n in graph if n.startswith("blk.1.")]
    shared = ["ffn_shexp_gate", "ffn_shexp_up", "ffn_shexp_act", "ffn_shexp_down", "ffn_out"]
    assert kinds[kinds.index("ffn_moe_out") + 1 : kinds.index("resid_out")] == shared
    assert graph["blk.1.resid_out"].inputs == ("blk.1.resid_mid", "blk.1.ffn_out")
    assert graph["blk.1.ffn_shexp_down"].weight == "blk.1.ffn_down_shexp.weight"
    for kind in ("ffn_topk", "ffn_expert_weights"):
        assert graph[f"blk.2.{kind}"].bias == "blk.2.exp_probs_b.bias"
    assert "blk.0.exp_probs_b.bias" not in ernie.gguf.tensors and "blk.0.ffn_gate.weight" in ernie.gguf.tensors


def test_the_bias_ranks_but_does_not_weigh(ernie_runs, ernie):
    """The top k are those of probabilities + bias (they differ from the probabilities' own top k on
    this prompt), and the weights are the probabilities at those ids, renormalized: no bias in them."""
    gpu, ref = ernie_runs
    changed = 0
    for L in MOE_LAYERS:
        probs = softmax_rows(np.asarray(ref[f"blk.{L}.ffn_router"], np.float64))
        bias = ernie.reference_engine.weight(f"blk.{L}.exp_probs_b.bias")
        ids = top_k(probs + bias, SPEC.n_expert_used)
        assert np.array_equal(gpu[f"blk.{L}.ffn_topk"], ids)
        changed += sum(set(a) != set(b) for a, b in zip(ids.tolist(), top_k(probs, SPEC.n_expert_used).tolist()))
        w = np.take_along_axis(probs, ids, axis=1)
        np.testing.assert_allclose(gpu[f"blk.{L}.ffn_expert_weights"], w / w.sum(1, keepdims=True), atol=1e-5)
    assert changed, "the selection bias never changes a choice: this test cannot tell it from no bias"


def test_gpu_equals_reference(ernie_runs):
    gpu, ref = ernie_runs
    cmp = compare(gpu, ref)
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)


@needs_llama
def test_both_engines_match_llamacpp_stage_by_stage(ernie, ernie_runs):
    """Every stage has a llama.cpp tensor; both engines pass against them (no thresholds=), and the
    top k equal llama.cpp's ids exactly, in order, on every token of every MoE layer."""
    mapped, unmapped = coverage(ernie.config, ernie.graph)
    assert not unmapped and len(mapped) == len(ernie.graph)
    orc = ernie.oracle(IDS)
    for run in ernie_runs:
        cmp = compare(run, orc)
        assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    for L in MOE_LAYERS:
        assert np.array_equal(ernie_runs[0][f"blk.{L}.ffn_topk"], orc[f"blk.{L}.ffn_topk"]), L


@needs_llama
def test_with_f32_weights_every_stage_is_llamacpps_to_1e5(tmp_path):
    """With F32 weights llama.cpp does not quantize activations: every stage, the dense layer's, the
    shared experts' and the biased router's, is the same quantity as the reference's."""
    spec = dataclasses.replace(SPEC, weight_type="F32", embed_type="F32")
    lab = labkit.open(write_tiny_model(tmp_path / "ernie-f32.gguf", spec, merges=["<t1> <t2>"]))
    orc, ref = lab.oracle(IDS), lab.reference(IDS)
    assert set(orc.captures) == set(lab.stages)
    cmp = compare(ref, orc, thresholds={kind: 1e-5 for kind in KIND_ORDER})
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)


@needs_llama
def test_a_near_tie_of_biased_scores_is_reported_as_a_tie(tmp_path):
    """Seed 4 has a token whose 4th and 5th experts are closer in biased score than llama.cpp's 8-bit
    activations and labkit's float32 agree there. The tie is judged on what the top k ranked (the
    probabilities plus exp_probs_b): compare names it a near-tie and passes."""
    path = write_tiny_model(tmp_path / "ernie4.gguf", dataclasses.replace(SPEC, seed=4), merges=["<t1> <t2>"])
    lab = labkit.open(path)
    gpu, orc = lab.run(IDS), lab.oracle(IDS)
    swapped = [L for L in MOE_LAYERS if any(set(a) != set(b) for a, b in
               zip(gpu[f"blk.{L}.ffn_topk"].tolist(), orc[f"blk.{L}.ffn_topk"].tolist()))]  # fmt: skip
    assert swapped, "the tie this test is about is gone"
    cmp = compare(gpu, orc)
    assert cmp.passed, cmp.table(only_failed=True)
    assert "near-tie" in cmp.row(f"blk.{swapped[0]}.ffn_topk").reason


def test_decode_and_generation_follow_the_reference(ernie):
    """Decode steps (the KV cache, the dense and the MoE layers one token at a time) generate what the
    reference generates, greedily."""
    gpu = ernie.generate(IDS[:5], max_new_tokens=4)
    ref = ernie.generate_reference(IDS[:5], max_new_tokens=4)
    assert gpu.ids == ref.ids and len(gpu.ids) == 4


# fault -> the stage kind where it first shows on ERNIE (None: the same result on this model)
FAULT_SHOWS_AT = {
    "expert_index_off_by_one": "ffn_topk",
    "bias_in_weights": "ffn_expert_weights",
    "no_renormalize": "ffn_expert_weights",
    "softmax_after_topk": None,  # renormalized weights: p_i / Σ p_j either way
    "softmax_before_topk": None,  # softmax gating already takes it before the top k
}


@pytest.mark.parametrize("fault", sorted(FAULT_SHOWS_AT))
def test_a_router_fault_bound_to_one_layer_shows_at_that_layer(ernie_runs, fault):
    _, ref = ernie_runs
    faulty = labkit.open("tiny-ernie4_5-moe").use("blk.2.moe_router", fault).run(IDS)
    cmp = compare(faulty, ref)
    where = FAULT_SHOWS_AT[fault]
    if where is None:
        assert cmp.passed, cmp.table(only_failed=True)
        return
    assert cmp.first_divergence == f"blk.2.{where}", cmp.table(only_failed=True)
    assert all(r.passed for r in cmp.rows if r.stage.startswith(("blk.0.", "blk.1."))), "layers 0-1 untouched"
    if fault == "bias_in_weights":  # the same experts, other weights (still summing to 1)
        assert np.array_equal(faulty["blk.2.ffn_topk"], ref["blk.2.ffn_topk"])
        np.testing.assert_allclose(faulty["blk.2.ffn_expert_weights"].sum(axis=1), 1.0, atol=1e-5)


def _meta(**extra) -> dict:
    a = "ernie4_5-moe"
    meta = {"general.architecture": a, f"{a}.block_count": 6, f"{a}.embedding_length": 64,
            f"{a}.attention.head_count": 2, f"{a}.feed_forward_length": 128, f"{a}.expert_count": 4,
            f"{a}.expert_used_count": 2, f"{a}.expert_feed_forward_length": 32,
            f"{a}.interleave_moe_layer_step": 1}  # fmt: skip
    return meta | {f"{a}.{k}": v for k, v in extra.items()}


def test_the_moe_layers_are_read_as_llamacpp_reads_them():
    """Past leading_dense_block_count, every interleave_moe_layer_step-th layer; the bias is optional
    (TENSOR_NOT_REQUIRED in llama.cpp), and an expert width per layer must be one width."""
    cfg = config_from_metadata(_meta(leading_dense_block_count=2, interleave_moe_layer_step=2), set())
    assert cfg.moe_layers == (False, False, False, True, False, True) and not cfg.expert_selection_bias
    assert [cfg.layer_ffn(L) for L in range(6)] == ["dense"] * 3 + ["moe", "dense", "moe"]
    assert config_from_metadata(_meta(), {"blk.0.exp_probs_b.bias"}).expert_selection_bias
    assert config_from_metadata(_meta(expert_feed_forward_length=[32] * 6), set()).d_ff_expert == 32
    with pytest.raises(UnsupportedArchitectureError, match="differs between layers"):
        config_from_metadata(_meta(expert_feed_forward_length=[32, 64, 32, 32, 32, 32]), set())
    with pytest.raises(ModelFileError, match="interleave_moe_layer_step"):
        config_from_metadata(_meta(interleave_moe_layer_step=0), set())
