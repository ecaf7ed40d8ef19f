"""A KV cache of a smaller type (`labkit.open(m, kv_type=...)`), end to end on the real models and tiny ones.

Both engines store the rows as llama.cpp's cache write rounds them (`blk.L.k_cache`, `blk.L.v_cache`), so a
clean GPU run's cache stages are the reference's recomputation bit for bit and no stage's own error leaves
its band (`attribute`), where `compare`'s totals grow with depth as rounding flips spread, as they do in
llama.cpp. A fault in the cache's write is found at its layer's cache stage; decoding on the quantized cache
gives the reference's tokens; the memory plan counts the cache in its type."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.attribution.attribute import attribute
from labkit.errors import InvalidArgumentError
from labkit.quant.cache_types import round_trip

from conftest import _open_cached

IDS = [1, 504, 357, 282, 469, 314, 2, 77, 9, 15, 203]  # under every model's vocabulary (the tiny ones: 512)


def _on(model: str, kv_type: str | None = None, **kw) -> labkit.Lab:
    """A real model on a cache type, sharing the session's lab's dequantized weights (a GB or two: opened anew,
    each would hold its own copy); a tiny model opened as it is."""
    if model.startswith("tiny-"):
        return labkit.open(model, kv_type=kv_type, **kw)
    return _open_cached(model).with_kv_type(kv_type, **kw)


def _cache_stages(lab) -> list[str]:
    return [s for s in lab.stages if s.endswith(("k_cache", "v_cache"))]


@pytest.mark.parametrize(
    "model,kv_type",
    [
        ("smollm2-135m", "q4_0"),
        ("gemma3-270m", "q8_0"),
        ("tiny-deepseek2", "q5_1"),
        ("tiny-qwen3moe", "iq4_nl"),
        ("tiny-granitehybrid", "f16"),
        ("tiny-gpt-oss", "bf16"),
    ],  # fmt: skip
)
def test_a_clean_run_on_a_quantized_cache_has_no_guilty_stage(model, kv_type, gives_back_memory):
    lab = _on(model, kv_type)
    assert len(_cache_stages(lab)) == 2 * len(lab.config.attention_layers)
    gpu = lab.run(IDS)
    ref = lab.reference(IDS)
    for st in (st for st in lab.graph if st.op == "kv_cache"):  # the GPU's cache: its own rows, as ggml rounds them
        assert np.array_equal(gpu[st.name], round_trip(gpu[st.inputs[0]], kv_type)), st.name
    if lab.config.ssm is not None:  # attribute does not recompute recurrent layers: the cache stages' checks stand
        return
    a = attribute(gpu, lab, reference=ref)
    assert a.guilty == [], f"{model} {kv_type}: guilty {a.guilty[:3]}"
    for name in _cache_stages(lab):
        assert a.row(name).local == 0.0, f"{name}: the GPU's write is not the reference's rounding of its input"


def test_a_cache_write_with_a_wrong_block_scale_is_found_at_its_layer(gives_back_memory):
    lab = _on("smollm2-135m", "q8_0")
    lab.use("blk.3.kv_cache_q8_0", "scale_per_64")
    run, ref = lab.run(IDS), lab.reference(IDS)
    a = attribute(run, lab, reference=ref)
    assert a.first_guilty in ("blk.3.k_cache", "blk.3.v_cache"), a.guilty[:4]
    assert set(a.guilty) <= {"blk.3.k_cache", "blk.3.v_cache"}  # nothing before it, nothing after it of its own
    assert labkit.verdict(run, lab, reference=ref).first_divergence == a.first_guilty
    lab.use("blk.3.kv_cache_q8_0", "default")
    assert attribute(lab.run(IDS), lab).guilty == []


def test_the_verdict_passes_a_clean_run_the_table_fails_and_says_why(gives_back_memory):
    """A 4-bit cache on 40 tokens: rounding flips compound past the f32 table in the deep layers (measured:
    hundreds of rows); no stage's own error leaves its band, so the verdict passes, each such row saying so."""
    lab = _on("smollm2-135m", "q4_0")
    ids = list(range(1, 41))
    run, ref = lab.run(ids), lab.reference(ids)
    assert not labkit.compare(run, ref).passed
    judged = labkit.verdict(run, lab, reference=ref)
    assert judged.passed, judged.headline()
    assert any("inherited" in r.reason for r in judged.rows)
    with pytest.raises(InvalidArgumentError, match="whole pass"):
        labkit.verdict(lab.run(ids[-1:], state=lab.prefill(ids[:-1], engine="gpu")), lab)


def test_blind_cases_on_a_quantized_cache_draw_its_write_fault(gives_back_memory):
    """A lab on a q8_0 cache runs the cache's write, so its faults are among the blind cases' candidates, and the
    one drawn shows at a cache stage (`labkit case --blind --kv-type q8_0`)."""
    from labkit.casebook.blind import blind_case_of, candidates

    lab = _on("smollm2-135m", "q8_0")
    assert ("kv_cache_q8_0", "scale_per_64") in candidates(lab)
    assert ("kv_cache_q8_0", "scale_per_64") not in candidates(_open_cached("smollm2-135m"))
    case = blind_case_of(lab, "kv_cache_q8_0", "scale_per_64")
    assert case is not None and case.reveal().stage.endswith(("k_cache", "v_cache")), case and case.reveal()
    assert "--kv-type-k q8_0 --kv-type-v q8_0 --seed" in case.session()[1]  # the answer reopens the same cache


def test_decoding_on_a_quantized_cache_gives_the_reference_s_tokens(gives_back_memory):
    """The compiled decode step loads the cache into its view each layer: its tokens are the reference's
    on the same q4_0 cache, which are not the f32 cache's."""
    lab = _on("smollm2-135m", "q4_0")
    ids = lab.tokenize("The capital of France is")
    gpu = lab.generate(ids, max_new_tokens=12)
    assert lab.executor.compiled_steps.refused == ""
    assert gpu.ids == lab.generate_reference(ids, max_new_tokens=12).ids
    f32 = _open_cached("smollm2-135m").generate(ids, max_new_tokens=12)
    assert f32.ids != gpu.ids  # the cache's rounding changes this continuation (measured), so the test sees it


def test_the_memory_plan_counts_the_cache_in_its_type():
    def cache_bytes(**kw) -> int:
        plan = _on("smollm2-135m", **kw).memory(4096, engine="gpu")
        return next(p.nbytes for p in plan.parts if p.part == "kv cache")

    f32, q8, q4 = cache_bytes(), cache_bytes(kv_type="q8_0"), cache_bytes(kv_type="q4_0")
    view = 2 * 4096 * 192 * 4  # one layer's K and V in f32, what the attention reads through
    assert q8 - view == f32 * 34 // 128 and q4 - view == f32 * 18 // 128
    mixed = cache_bytes(kv_type_k="q8_0", kv_type_v="f32")
    assert mixed == f32 // 2 + f32 // 2 * 34 // 128 + view // 2


def test_a_state_made_on_one_cache_type_is_refused_by_another(gives_back_memory):
    """A prefix cache holds its type's rows: a lab on another type would read them as its own."""
    q8 = labkit.open("tiny-qwen3moe", kv_type="q8_0")
    f32 = labkit.open("tiny-qwen3moe")
    for engine in ("gpu", "reference"):
        state = q8.prefill(IDS[:5], engine=engine)
        go = f32.run if engine == "gpu" else f32.reference
        with pytest.raises(InvalidArgumentError, match="cache is q8_0; the lab keeps f32"):
            go(IDS[5:], state=state)
        rest = (q8.run if engine == "gpu" else q8.reference)(IDS[5:], state=state)
        whole = (q8.run if engine == "gpu" else q8.reference)(IDS)
        assert np.allclose(rest["logits"], whole["logits"][5:], atol=1e-3)  # the prefix path on the quantized cache


def test_a_bad_kv_type_is_refused_before_the_file_is_read(tmp_path):
    with pytest.raises(InvalidArgumentError, match="kv_type='q3_k'"):
        labkit.open(tmp_path / "missing.gguf", kv_type="q3_k")
