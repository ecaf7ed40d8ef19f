"""llama.cpp as a stage-level oracle (extra `oracle`): mapping, thresholds, fault localization, CLI.

Tiny F32 models check that every mapped llama.cpp tensor is the same quantity as labkit's
stage (NMSE ~1e-7: without quantized weights llama.cpp does not quantize activations).
The real models check the thresholds, coverage, the GPU pass, and that a fault injected
into a labkit run is localized to its stage under llama.cpp's (looser) thresholds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import labkit
from labkit.compare import REFERENCE_THRESHOLDS, compare, stage_kind
from labkit.errors import OracleUnavailableError
from labkit.model.graph import build_graph
from labkit.oracle import llamacpp, llamacpp_run

from conftest import _open_cached, needs_llama

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "labkit" / "data" / "golden"

MODELS = ("gemma3-270m", "smollm2-135m")
# one prompt the thresholds were measured on, one they were not
PROMPTS = ("The color of the sky is", "In 1969, 3 astronauts flew 384,400 km to the")
ARCHS = ("gemma3", "llama", "qwen2", "qwen3", "gemma2", "phi3")

_ORACLE: dict[tuple[str, str], labkit.Run] = {}
_REFERENCE: dict[tuple[str, str], labkit.Run] = {}


def _oracle(model: str, prompt: str) -> labkit.Run:
    if (model, prompt) not in _ORACLE:
        _ORACLE[model, prompt] = _open_cached(model).oracle(prompt)
    return _ORACLE[model, prompt]


def _reference(model: str, prompt: str) -> labkit.Run:
    if (model, prompt) not in _REFERENCE:
        _REFERENCE[model, prompt] = _open_cached(model).reference(prompt)
    return _REFERENCE[model, prompt]


def _coverage(cmp: labkit.Comparison, lab: labkit.Lab) -> float:
    return len(cmp.rows) / len(lab.stages)


# ----------------------------------------------------------------- no llama.cpp needed
def test_thresholds_have_reference_keys_and_stay_tight():
    th = llamacpp.ORACLE_THRESHOLDS
    assert set(th) == set(REFERENCE_THRESHOLDS)
    for kind, t in th.items():
        assert REFERENCE_THRESHOLDS[kind] <= t <= 5e-2, kind  # a fault at 1e-1 is always caught


@pytest.mark.parametrize("arch", ARCHS)
def test_mapping_names_every_stage_kind(arch, tiny_model):
    lab = labkit.open(tiny_model(arch))
    kinds = {s.kind for s in lab.graph}
    mapped, unmapped = set(llamacpp.MAPPINGS[arch]), set(llamacpp.NO_COUNTERPART[arch])
    assert kinds <= mapped | unmapped, f"stage kinds neither mapped nor listed: {kinds - mapped - unmapped}"
    assert not mapped & unmapped
    assert mapped <= kinds, f"stale mapping entries: {mapped - kinds}"
    names, rest = llamacpp.coverage(lab.config, lab.graph)
    assert len(names) + len(rest) == len(lab.graph)


def test_missing_llama_cpp_raises_one_line_error(monkeypatch, tiny_model):
    lab = labkit.open(tiny_model("llama"))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", None)
    monkeypatch.setattr(llamacpp_run, "_BACKEND", None)
    with pytest.raises(OracleUnavailableError, match=r"pip install labkit\[oracle\]") as e:
        lab.oracle([1, 2, 3])
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------- tiny models, every architecture
@pytest.mark.oracle
@needs_llama
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_f32_every_stage_is_the_same_quantity(arch, llama_loadable_tiny):
    lab = labkit.open(llama_loadable_tiny(arch))
    ids = [3, 17, 100, 5, 9, 44, 200, 7]  # 8 tokens: longer than tiny gemma3's sliding window of 4
    orc, ref = lab.oracle(ids), lab.reference(ids)
    unmapped = {s.name for s in lab.graph if s.kind in llamacpp.NO_COUNTERPART[arch]}
    assert set(orc.captures) == set(lab.stages) - unmapped
    cmp = compare(ref, orc, thresholds={k: 1e-5 for k in REFERENCE_THRESHOLDS})
    assert cmp.passed, cmp.table(only_failed=True)
    assert set(cmp.missing) == unmapped
    c = lab.config
    assert orc["blk.0.q"].shape == (8, c.n_heads * c.head_dim)
    assert orc["blk.1.attn_scores"].shape == (c.n_heads, 8, 8)
    assert orc["logits"].shape == (8, c.vocab_size)


NEW_ARCHS = ("qwen3", "gemma2", "phi3")
TINY_IDS = [3, 17, 100, 5, 9, 44, 200, 7, 61, 2]  # 10 tokens: past gemma2's tiny sliding window of 4


@pytest.mark.oracle
@needs_llama
@pytest.mark.parametrize("weight_type", ["F32", "Q8_0"])
@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_new_architecture_gpu_and_reference_pass_against_llamacpp(arch, weight_type, llama_loadable_tiny):
    """qwen3, gemma2 and phi3, each a graph description: the GPU pass and the reference pass every
    mapped stage against llama.cpp's own tensors (its thresholds: 8-bit activations on Q8_0)."""
    lab = labkit.open(llama_loadable_tiny(arch, weight_type))
    orc = lab.oracle(TINY_IDS)
    for run in (lab.run(TINY_IDS), lab.reference(TINY_IDS)):
        cmp = compare(run, orc, thresholds=lab.oracle_thresholds())
        assert _coverage(cmp, lab) >= 0.9, cmp.missing
        assert cmp.passed, f"{arch} {weight_type} {run.engine}:\n" + cmp.table(only_failed=True)
    if arch == "gemma2":  # the window and the caps are real: layer 0 is local, scores are capped
        s = orc["blk.0.attn_scores"]
        assert np.isneginf(s[:, -1, :-4]).all() and np.isfinite(s[:, -1, -4:]).all()
        assert np.abs(s[np.isfinite(s)]).max() <= lab.config.attn_softcap
        assert np.abs(orc["logits"]).max() <= lab.config.final_softcap


# ----------------------------------------------------------------- the real models
@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("model", MODELS)
def test_reference_passes_against_llamacpp(model, prompt):
    lab = _open_cached(model)
    cmp = compare(_reference(model, prompt), _oracle(model, prompt))  # the oracle run's precision picks its table
    assert _coverage(cmp, lab) >= 0.9, cmp.missing
    assert cmp.passed, cmp.table(only_failed=True)


@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
@pytest.mark.parametrize("model", MODELS)
def test_gpu_passes_against_llamacpp(model):
    lab, prompt = _open_cached(model), PROMPTS[1]
    cmp = labkit.compare(lab.run(prompt), _oracle(model, prompt))  # no thresholds=: issue 10
    assert cmp.thresholds_used.startswith("int8-activations table")
    assert _coverage(cmp, lab) >= 0.9, cmp.missing
    assert cmp.passed, cmp.table(only_failed=True)


@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
@pytest.mark.parametrize("model", MODELS)
def test_oracle_layout_and_logits_are_llamacpps(model):
    lab, prompt = _open_cached(model), PROMPTS[0]
    orc, ref = _oracle(model, prompt), _reference(model, prompt)
    T, c = len(orc.tokens), lab.config
    assert orc.engine == "llamacpp" and orc.stages == lab.stages
    for name, a in orc.captures.items():
        assert a.shape == ref[name].shape, name
    assert orc["blk.0.q_rope"].shape == (T, c.n_heads * c.head_dim)
    for L in (0, c.n_layers - 1):
        s, p = orc[f"blk.{L}.attn_scores"], orc[f"blk.{L}.attn_probs"]
        assert np.array_equal(np.isneginf(s), np.isneginf(ref[f"blk.{L}.attn_scores"]))  # llama.cpp's own mask
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert np.all(p[np.isneginf(s)] == 0)
    # the last position's logits are exactly what llama.cpp's own API returned for the golden file
    golden = next(g for g in json.loads((GOLDEN / f"{model}.json").read_text())["prompts"] if g["text"] == prompt)
    assert golden["tokens"] == orc.tokens
    z = orc.logits(-1)
    assert [int(i) for i in np.argsort(-z, kind="stable")[:10]] == [t["id"] for t in golden["top"]]
    np.testing.assert_allclose(z[[t["id"] for t in golden["top"]]], [t["logit"] for t in golden["top"]], atol=1e-3)


# ----------------------------------------------------------------- faults are localized
def _rope_wrong_style(st):
    return {"style": {"neox": "normal", "normal": "neox"}[st.params["style"]]}


def _scores_unscaled(st):
    return {"scale": 1.0}


FAULTS = {  # name → (faulty stage, how its params go wrong); everything downstream follows from it
    "rope-style": ("blk.3.q_rope", _rope_wrong_style),
    "attn-scale": ("blk.1.attn_scores", _scores_unscaled),
    "weight-sign": ("blk.2.ffn_up", None),  # the weight itself is negated
}


@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("model", MODELS)
def test_fault_in_reference_run_is_localized(model, fault, monkeypatch):
    lab, prompt = _open_cached(model), PROMPTS[0]
    target, make = FAULTS[fault]
    eng, i = lab.reference_engine, lab.stages.index(target)
    st = eng.graph[i]
    if make is None:
        monkeypatch.setitem(eng.weights._held, st.weight, -eng.weight(st.weight))
    else:  # the stage as the graph describes it, with a wrong parameter
        wrong = dataclasses.replace(st, params={**st.params, **make(st)})
        monkeypatch.setattr(eng, "graph", [*eng.graph[:i], wrong, *eng.graph[i + 1 :]])
    run = lab.reference(prompt)  # the fault cascades through every later stage
    cmp = compare(run, _oracle(model, prompt), thresholds=lab.oracle_thresholds())
    assert cmp.first_divergence == target, cmp.table(only_failed=True)
    assert cmp.row(target).nmse > 3 * cmp.row(target).threshold


@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
@pytest.mark.parametrize(
    "model, variant, target",
    [
        ("gemma3-270m", "rope=normal_pairs", "blk.0.q_rope"),  # rope-style
        ("gemma3-270m", "matmul_q4_k=mins_added", "blk.0.attn_out"),  # q4k-sign: the first Q4_K weight
        ("gemma3-270m", "rmsnorm=scale_clamp", "blk.0.attn_norm"),  # norm-cascade
        ("smollm2-135m", "rmsnorm=offset_twice", "blk.0.attn_norm"),  # 000's norm offset
        ("gemma3-270m", "lm_head=skip_last_window", "logits"),  # lm-head-unwritten
        ("gemma3-270m", "attention=tiled", None),  # a correct tier: nothing to find
    ],
)
@pytest.mark.usefixtures("gives_back_memory")
def test_gpu_variant_is_localized_by_llamacpp(model, variant, target):
    """Every case fault that changes the prompt pass is caught by the llama.cpp thresholds at the
    stage it breaks (decode_uses_prefill and the sampler faults act after the prompt pass)."""
    fam, name = variant.split("=")
    lab, prompt = labkit.open(model, variants={fam: name}), PROMPTS[0]
    cmp = compare(lab.run(prompt), _oracle(model, prompt), thresholds=lab.oracle_thresholds())
    assert cmp.first_divergence == target, cmp.table(only_failed=True)


# ----------------------------------------------------------------- the CLI
@pytest.mark.oracle
@pytest.mark.slow
@needs_llama
def test_cli_compare_against_llamacpp_json():
    exe = Path(sys.executable).parent / "labkit"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "labkit.cli"]
    args = ["compare", "smollm2-135m", "--prompt", "Paris is the capital of", "--against", "llamacpp", "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd + args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    assert data["passed"] is True and data["first_divergence"] is None
    assert data["b"] == "llamacpp"
    lab = _open_cached("smollm2-135m")
    assert len(data["stages"]) >= 0.9 * len(lab.stages)
    assert {stage_kind(r["stage"]) for r in data["stages"]} == {s.kind for s in build_graph(lab.config)}


@pytest.mark.oracle
@needs_llama
def test_oracle_takes_the_capture_filters_of_run():
    """names (globs) and layers keep fewer of llama.cpp's tensors, the same values as a full capture."""
    lab, prompt = _open_cached("smollm2-135m"), PROMPTS[0]
    full = _oracle("smollm2-135m", prompt)
    some = lab.oracle(prompt, names=["blk.*.attn_norm", "logits"], layers=[2])
    assert sorted(some.captures) == ["blk.2.attn_norm", "logits"]
    for name in some.captures:
        np.testing.assert_array_equal(some[name], full[name], err_msg=name)
