"""Mixture of experts (qwen3moe): router stages on both engines, against llama.cpp, and its faults.

Tiny qwen3moe files (8 experts, 2 per token; the writer's random weights, and one quantized by
llama.cpp's own quantizer) go through the GPU pass, the float64 reference and llama.cpp: every
stage agrees, the selected experts' ids equal llama.cpp's on every token of every layer, and each
`moe_router` fault bound to one layer parts from the reference at that layer's `ffn_topk` or
`ffn_expert_weights` and nowhere before.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import labkit
from labkit.compare import compare
from labkit.model.gguf_file import open_gguf
from labkit.model.tiny import TinySpec, write_tiny_model
from labkit.oracle.llamacpp import coverage
from labkit.oracle.quantize import quantize

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
IDS = [3, 17, 100, 5, 9, 44, 200, 7, 12, 90, 31]
MOE = TinySpec(arch="qwen3moe", weight_type="Q8_0", n_expert=8, n_expert_used=2, d_ff_expert=256, seed=5)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf", MOE, merges=["<t1> <t2>"])


@pytest.fixture(scope="module")
def moe(moe_path):
    return labkit.open(moe_path)


def test_qwen3moe_graph_has_the_router_stages(moe):
    kinds = [s.split(".", 2)[2] for s in moe.stages if s.startswith("blk.0.")]
    moe_kinds = ["ffn_router", "ffn_router_probs", "ffn_topk", "ffn_expert_weights", "ffn_moe_gate", "ffn_moe_up",
                 "ffn_moe_act", "ffn_moe_down", "ffn_moe_out"]  # fmt: skip
    assert kinds[kinds.index("ffn_norm") + 1 : kinds.index("resid_out")] == moe_kinds
    assert moe.config.n_expert == 8 and moe.config.n_expert_used == 2 and moe.config.expert_weights_norm


def test_gpu_equals_reference_and_ids_are_integers(moe):
    gpu, ref = moe.run(IDS), moe.reference(IDS)
    cmp = compare(gpu, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    for L in range(MOE.n_layers):
        ids = gpu[f"blk.{L}.ffn_topk"]
        assert ids.dtype == np.int32 and ids.shape == (len(IDS), 2)
        assert np.array_equal(ids, ref[f"blk.{L}.ffn_topk"])
        w = gpu[f"blk.{L}.ffn_expert_weights"]
        assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6), "qwen3moe renormalizes the selected weights"


@needs_llama
def test_both_engines_agree_with_llamacpp_on_every_stage(moe):
    orc = moe.oracle(IDS)
    mapped, unmapped = coverage(moe.config, moe.reference_engine.graph)
    assert not unmapped, f"stages without a llama.cpp counterpart: {unmapped}"
    for run in (moe.run(IDS), moe.reference(IDS)):
        cmp = compare(run, orc)  # the thresholds compare picks: int8 activations against llama.cpp
        assert cmp.passed and not cmp.missing, f"{run.engine} vs llama.cpp:\n{cmp.table(only_failed=True)}"
    for L in range(MOE.n_layers):  # the experts each token goes to, exactly, in llama.cpp's order
        got, want = moe.run(IDS)[f"blk.{L}.ffn_topk"], orc[f"blk.{L}.ffn_topk"]
        assert np.array_equal(got, want), f"layer {L}: labkit {got.tolist()} vs llama.cpp {want.tolist()}"


@needs_llama
def test_a_file_quantized_by_llamacpp_passes(tmp_path):
    """llama.cpp's Q4_K_M of an F32 qwen3moe: K-quant experts, the router kept in F32."""
    src = write_tiny_model(tmp_path / "moe-f32.gguf", TinySpec(**{**MOE.__dict__, "weight_type": "F32",
                           "embed_type": "F32"}), merges=["<t1> <t2>"])  # fmt: skip
    dst = quantize(src, tmp_path / "moe-q4_k_m.gguf", "Q4_K_M")
    types = {t.type_name for n, t in open_gguf(dst).tensors.items() if "_exps" in n}
    assert types <= {"Q4_K", "Q5_K", "Q6_K", "Q8_0"} and "Q4_K" in types, types
    assert open_gguf(dst).tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
    lab = labkit.open(dst)
    gpu, ref, orc = lab.run(IDS), lab.reference(IDS), lab.oracle(IDS)
    assert compare(gpu, ref).passed, compare(gpu, ref).table(only_failed=True)
    for run in (gpu, ref):
        cmp = compare(run, orc)
        assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)


# fault -> the stage kind where it must first show (None: it cannot show on a renormalizing model)
FAULT_SHOWS_AT = {
    "expert_index_off_by_one": "ffn_topk",
    "no_renormalize": "ffn_expert_weights",
    "softmax_after_topk": None,
}


@pytest.mark.parametrize("fault", sorted(FAULT_SHOWS_AT))
def test_a_router_fault_bound_to_one_layer_shows_at_that_layer(moe_path, moe, fault):
    ref = moe.reference(IDS)
    faulty = labkit.open(moe_path).use("blk.1.moe_router", fault)
    cmp = compare(faulty.run(IDS), ref)
    where = FAULT_SHOWS_AT[fault]
    if where is None:
        # softmax over the k selected = their probabilities renormalized: harmless where the model
        # renormalizes anyway (qwen3moe), as litgpt#2013's discussion found for Mixtral
        assert cmp.passed, cmp.table(only_failed=True)
        return
    assert cmp.first_divergence == f"blk.1.{where}", cmp.table(only_failed=True)
    assert all(r.passed for r in cmp.rows if r.stage.startswith("blk.0.")), "layer 0 must be untouched"


def test_a_topk_mismatch_is_reported_as_the_experts_that_differ(moe_path, moe):
    ref = moe.reference(IDS)
    cmp = compare(labkit.open(moe_path).use("blk.0.moe_router", "expert_index_off_by_one").run(IDS), ref)
    row = cmp.row("blk.0.ffn_topk")
    assert not row.passed and "only the first picks {" in row.reason and ", only the second {" in row.reason
    assert row.first_bad_position == 0 and row.max_abs >= 1


def test_teacher_forced_routing_takes_another_runs_ids(moe_path, moe):
    """`lab.reference(..., route_as=run)` routes as another run did (a near-tie broken the other way
    then compares as a tie): routing as the GPU did changes nothing; routing as a faulty run did
    gives that run's ids, and weights taken at them."""
    gpu = moe.run(IDS)
    same = moe.reference(IDS, route_as=gpu)
    assert compare(gpu, same).passed
    shifted = labkit.open(moe_path).use("blk.0.moe_router", "expert_index_off_by_one").run(IDS)
    forced = moe.reference(IDS, route_as=shifted)
    assert np.array_equal(forced["blk.0.ffn_topk"], shifted["blk.0.ffn_topk"])
    assert compare(shifted, forced, positions=None).row("blk.0.ffn_topk").passed
    assert not np.allclose(forced["blk.0.ffn_moe_out"], same["blk.0.ffn_moe_out"])
    with pytest.raises(labkit.errors.InvalidArgumentError, match="route_as"):
        moe.reference(IDS, route_as=moe.run(IDS, names=["logits"]))


def test_decode_steps_route_like_the_prefill(moe):
    """A KV-cached decode step routes its token as the prefill's last row does."""
    step = moe.decode_step(IDS)
    full = moe.run(IDS)
    assert np.array_equal(step["blk.1.ffn_topk"][-1], full["blk.1.ffn_topk"][-1])
    assert np.allclose(step["logits"][-1], full["logits"][-1], atol=1e-4)
    gen = moe.generate(IDS, max_new_tokens=4)
    assert gen.ids == moe.generate_reference(IDS, max_new_tokens=4).ids


def test_the_memory_plan_counts_the_experts(moe):
    """The 3-D expert tensors are weights the GPU holds (their GGUF bytes) and the reference holds
    (these are small: a large one is streamed an expert at a time), so both plans count them."""
    plan = moe.memory(tokens=16)
    part = {(p.engine, p.part): p.nbytes for p in plan.parts}
    experts = [t for n, t in moe.gguf.tensors.items() if n.endswith("_exps.weight")]
    assert part["gpu", "weights"] >= sum(t.nbytes for t in experts)
    assert part["reference", "weight cache"] >= 4 * sum(np.prod(t.shape) for t in experts)


def test_a_gather_past_the_loop_turn_cap_is_a_typed_error(moe_path, monkeypatch):
    """The prefill gather walks T x k slots in one thread: 11 tokens x 2 experts take 23 loop turns
    (22 trips and the ending test). Under a cap of 22 the pass is refused, typed; under 23 it runs."""
    from labkit.errors import GpuLimitError
    from labkit.gpu.device import GpuDevice

    monkeypatch.setattr(GpuDevice, "loop_turn_cap", property(lambda self: 22))
    with pytest.raises(GpuLimitError, match="22 slots in one thread"):
        labkit.open(moe_path).run(IDS, names=["logits"])
    monkeypatch.setattr(GpuDevice, "loop_turn_cap", property(lambda self: 23))
    assert np.isfinite(labkit.open(moe_path).run(IDS, names=["logits"]).logits()).all()
