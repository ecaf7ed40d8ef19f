"""labkit.attribute: a stage's own error told apart from what it inherited, on the real models.

Clean runs (the GPU pass, the reference, llama.cpp's own tensors) must name no stage; faults
bound to one layer must name that layer's faulty stages and nothing else; a fault bound to
every layer must name every stage of that kernel and nothing else; and a fault too small for
a total-error comparison against llama.cpp (blk.15.ffn_up's scales × 1.02) must be named.
The emulations the noise bands stand on are checked against independent oracles (gguf's own
Q8_0 quantizer, a brute-force bf16 rounding).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import labkit
from labkit.attribution.activation_quant import q8_0, q8_k
from labkit.attribution.emulation import f32_accumulated
from labkit.attribution.rounding import to_bf16
from labkit.attribution.segments import segment_of
from labkit.captures import Run
from labkit.errors import InvalidArgumentError, NoCommonStagesError
from labkit.gpu.pass_request import PassRequest

from conftest import give_back_memory

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
PROMPTS = ("The color of the sky is", "Paris is the capital of France, and Berlin is the capital of")


def _outlier_rows(rng, shape) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    x[:, 7] *= 40  # an activation outlier, as real residual streams have
    return x


# ----------------------------------------------------------------- the emulations, against oracles
def test_q8_0_matches_gguf_quantizer():
    x = _outlier_rows(np.random.default_rng(1), (5, 96))
    want = quants.dequantize(quants.quantize(x, Q.Q8_0), Q.Q8_0)
    got = q8_0(x)
    assert np.array_equal(got, want), f"max |diff| {np.abs(got - want).max()}"


def test_q8_k_rounds_each_block_to_its_own_scale():
    """Q8_K: the value of largest magnitude maps to -127 exactly, every other to within half a step."""
    x = _outlier_rows(np.random.default_rng(2), (3, 512))
    got = q8_k(x).reshape(3, 2, 256)
    b = x.reshape(3, 2, 256)
    idx = np.abs(b).argmax(-1)[..., None]
    d = -np.take_along_axis(b, idx, -1) / 127  # the block's step, with the sign llama.cpp gives it
    assert np.allclose(np.take_along_axis(got, idx, -1), np.take_along_axis(b, idx, -1), rtol=1e-6)
    steps = got / d
    assert np.allclose(steps, np.round(steps), atol=1e-3), "values are not whole steps of the block scale"
    assert np.all(np.abs(got - b) <= np.abs(d) * 0.5 + 1e-6)


def test_bf16_rounds_to_the_nearest_even():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4000) * 10.0 ** rng.integers(-6, 6, 4000)).astype(np.float32)
    x[:3] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)]  # exact ties: to the even neighbour
    bits = x.view(np.uint32)
    down = (bits & 0xFFFF0000).view(np.float32)
    up = ((bits & 0xFFFF0000) + 0x10000).astype(np.uint32).view(np.float32)
    dd, du = np.abs(x.astype(np.float64) - down), np.abs(up.astype(np.float64) - x)
    even_up = ((bits >> 16) & 1) == 1
    want = np.where(dd < du, down, np.where(du < dd, up, np.where(even_up, up, down)))
    assert np.array_equal(to_bf16(x), want)
    assert to_bf16(np.float32(1 + 2**-8)) == 1.0 and to_bf16(np.float32(1 + 3 * 2**-8)) == np.float32(1 + 2**-6)


def test_f32_accumulation_is_an_f32_product():
    rng = np.random.default_rng(4)
    x, w = _outlier_rows(rng, (6, 200)), rng.standard_normal((9, 200)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    got = f32_accumulated(x, w)
    assert got.dtype == np.float32
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 0 < err < 1e-5, f"relative error {err:.2e}: not an f32 sum of the right products"


# ----------------------------------------------------------------- segments
def test_a_segment_reaches_back_to_captured_stages(smollm):
    """What forward hooks capture (no roped q/k, scores or probabilities): attn_out is checked
    together with the attention stages that lead to it from q, k and v."""
    hooks = {"blk.0.attn_norm", "blk.0.q", "blk.0.k", "blk.0.v", "blk.0.attn_out"}
    seg = segment_of("blk.0.attn_out", smollm.graph, hooks)
    want = ("q_rope", "k_rope", "attn_scores", "attn_probs", "attn_ctx", "attn_out")
    assert seg.stages == tuple(f"blk.0.{k}" for k in want)
    assert seg.inputs == ("blk.0.q", "blk.0.k", "blk.0.v")
    assert seg.name == "blk.0.q_rope … blk.0.attn_out"
    assert segment_of("blk.0.q", smollm.graph, hooks).stages == ("blk.0.q",)


# ----------------------------------------------------------------- clean runs name no stage
def _ratios(att) -> str:
    worst = max(att.rows, key=lambda r: r.ratio)
    return f"worst {worst.name}: local {worst.local:.2e}, limit {worst.limit:.2e} ({worst.ratio:.2f}×)"


@pytest.mark.slow
@pytest.mark.parametrize("real_lab", ["smollm2-135m", "gemma3-270m"], indirect=True)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_clean_gpu_run_has_no_guilty_stage(real_lab, prompt):
    att = labkit.attribute(real_lab.run(prompt), real_lab)
    assert att.guilty == [], att.table(only_guilty=True)
    assert len(att.rows) == len(real_lab.stages)
    assert max(r.ratio for r in att.rows) < 0.5, _ratios(att)  # the factor's margin (GUILT_FACTOR)
    assert all(r.band > 0 for r in att.rows if r.stage.endswith(("ffn_up", "attn_out"))), "an f32 matmul has a band"


@pytest.mark.slow
def test_the_reference_has_no_local_error(smollm):
    ref = smollm.reference(PROMPTS[0])
    att = labkit.attribute(ref, smollm, reference=ref)
    assert att.guilty == [] and max(r.local for r in att.rows) == 0.0
    assert att.precision == "float64" and max(r.total for r in att.rows) == 0.0


# ----------------------------------------------------------------- faults
def _guilty(model: str, variants: dict, prompt: str = PROMPTS[1]) -> list[str]:
    lab = labkit.open(model, variants=variants)
    guilty = labkit.attribute(lab.run(prompt), lab).guilty
    del lab
    give_back_memory()  # its reference weights: a GB a lab, else held until the module ends
    return guilty


@pytest.mark.slow
def test_a_fault_in_one_layer_names_that_stage_only(gemma):
    assert _guilty("gemma3-270m", {"blk.5.rope": "normal_pairs"}) == ["blk.5.q_rope", "blk.5.k_rope"]


@pytest.mark.slow
def test_a_norm_fault_in_one_layer_names_that_layers_norms(smollm):
    assert _guilty("smollm2-135m", {"blk.7.rmsnorm": "scale_clamp"}) == ["blk.7.attn_norm", "blk.7.ffn_norm"]


@pytest.mark.slow
def test_nan_made_by_a_stage_is_its_own_and_nan_read_is_inherited(smollm):
    """A NaN written into layer 3's probabilities (a patch, as a faulty softmax would): every later
    stage reads NaN and computes NaN exactly as it should, so only the softmax is guilty."""

    def nan_at(a, st):
        a = a.copy()
        a[2, 4, 1] = np.nan
        return a

    att = labkit.attribute(smollm.run(PROMPTS[0], patch={"blk.3.attn_probs": nan_at}), smollm)
    assert att.guilty == ["blk.3.attn_probs"], att.table(only_guilty=True)
    assert "NaN" in att.row("blk.3.attn_probs").reason


@pytest.mark.slow
def test_a_fault_bound_to_every_layer_names_every_stage_of_that_kernel(gemma):
    norms = [st.name for st in gemma.graph if st.op == "rmsnorm"]
    assert _guilty("gemma3-270m", {"rmsnorm": "scale_clamp"}) == norms
    q4k = [st.name for st in gemma.graph if st.weight and gemma.gguf.tensors[st.weight].type_name == "Q4_K"]
    assert st_names_are_matmuls(gemma, q4k)
    assert _guilty("gemma3-270m", {"matmul_q4_k": "mins_added"}) == q4k


def st_names_are_matmuls(lab, names: list[str]) -> bool:
    ops = {st.name: st.op for st in lab.graph}
    return bool(names) and all(ops[n] == "matmul" for n in names)


@pytest.mark.slow
def test_a_patched_stage_is_guilty_and_its_readers_only_inherit(smollm):
    run = smollm.run(PROMPTS[0], patch={"blk.9.ffn_gate": lambda a, st: a * 1.001})
    att = labkit.attribute(run, smollm)
    assert att.guilty == ["blk.9.ffn_gate"], att.table(only_guilty=True)
    after = att.row("blk.9.ffn_act")
    assert after.inherited > 1e-8 and not after.guilty, "the next stage inherits the error and is not blamed"
    assert "first guilty stage: blk.9.ffn_gate" in att.headline()


@pytest.mark.slow
def test_a_segment_is_blamed_where_hooks_see_no_stage(smollm):
    """Only what forward hooks see is kept: a fault in attn_ctx is named by its segment."""
    hidden = ("q_rope", "k_rope", "attn_scores", "attn_probs", "attn_ctx", "resid_mid")
    run = smollm.run(PROMPTS[0], patch={"blk.3.attn_ctx": lambda a, st: a * 1.01})
    run.captures = {n: a for n, a in run.captures.items() if not n.endswith(hidden)}
    att = labkit.attribute(run, smollm)
    assert att.guilty == ["blk.3.attn_out"], att.table(only_guilty=True)
    assert att.row("blk.3.attn_out").name == "blk.3.q_rope … blk.3.attn_out"


@pytest.mark.slow
def test_a_decode_step_is_attributed_on_its_cache(smollm):
    ids = smollm.prompt_ids(PROMPTS[0])
    ex = smollm.executor
    state = ex.new_state(len(ids))
    past = Run(smollm.name, "gpu", ids[:-1], smollm.stages, ex.run_pass(PassRequest(ids[:-1]), state).captures)
    step = Run(
        smollm.name,
        "gpu",
        ids[-1:],
        smollm.stages,
        ex.run_pass(PassRequest(ids[-1:]), state).captures,
        n_past=len(ids) - 1,
    )
    att = labkit.attribute(step, smollm, past=past)
    assert att.guilty == [] and att.n_past == len(ids) - 1, att.table(only_guilty=True)
    assert att.row("blk.0.attn_scores").total < 1e-8  # the reference step read the reference's own cache
    with pytest.raises(InvalidArgumentError, match="past="):
        labkit.attribute(step, smollm)


# ----------------------------------------------------------------- llama.cpp's own tensors
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="needs the oracle extra (llama-cpp-python)")


@pytest.mark.slow
@pytest.mark.oracle
@needs_llama
@pytest.mark.parametrize("real_lab", ["smollm2-135m", "gemma3-270m"], indirect=True)
def test_llamacpp_clean_tensors_have_no_guilty_stage(real_lab):
    att = labkit.attribute(real_lab.oracle(PROMPTS[1]), real_lab)
    assert att.precision == "int8-activations"
    assert att.guilty == [], att.table(only_guilty=True)
    assert max(r.ratio for r in att.rows) < 0.6, _ratios(att)


@pytest.mark.slow
@pytest.mark.oracle
@needs_llama
def test_a_small_weight_fault_in_llamacpp_is_named_without_thresholds(smollm, tmp_path):
    """blk.15.ffn_up's scales × 1.02 in a copy llama.cpp runs: the stage's own NMSE is about 1e-3,
    under llama.cpp's total-error threshold there, so compare passes and attribute names it."""
    from labkit.model.corrupt import scale_block_scales
    from labkit.oracle.llamacpp_run import run_llamacpp

    bad = scale_block_scales(smollm.path, tmp_path / "bad.gguf", "blk.15.ffn_up.weight", 1.02)
    ids = smollm.prompt_ids(PROMPTS[1])
    run = Run(smollm.name, "llamacpp", ids, smollm.stages, run_llamacpp(bad, smollm.config, smollm.graph, ids, None))
    ref = smollm.reference(ids)
    assert labkit.compare(run, ref).passed, "the fault was meant to be below compare's llama.cpp table"
    att = labkit.attribute(run, smollm, reference=ref)
    assert att.guilty == ["blk.15.ffn_up"], att.table(only_guilty=True)
    assert 3e-4 < att.row("blk.15.ffn_up").local < 3e-3


# ----------------------------------------------------------------- reports and errors
@pytest.mark.slow
def test_reports_for_people_and_tools(smollm):
    run = smollm.run(PROMPTS[0], patch={"blk.2.v": lambda a, st: a * 1.01})
    att = labkit.attribute(run, smollm)
    lines = [json.loads(line) for line in att.to_jsonl().splitlines()]
    assert len(lines) == len(att.rows)
    bad = next(rec for rec in lines if rec["verdict"] == "guilty")
    assert bad["stage"] == "blk.2.v" and {"local", "total", "band", "inherited", "position"} <= set(bad)
    assert "GUILTY" in att.table() and "blk.2.v" in att._repr_html_()
    assert att.to_dict()["first_guilty"] == "blk.2.v"


def test_a_run_with_no_stage_of_the_model_is_refused(smollm):
    run = Run(smollm.name, "dumps", [1, 2], smollm.stages, {"not_a_stage": np.zeros((2, 3))})
    with pytest.raises(NoCommonStagesError, match="nothing to attribute"):
        labkit.attribute(run, smollm)


# ----------------------------------------------------------------- reproducers
def _check(directory: Path) -> subprocess.CompletedProcess:
    """check_stage.py with labkit made unimportable: it must stand on numpy and gguf alone."""
    code = "import sys, runpy; sys.modules['labkit'] = None; sys.argv = ['check_stage.py']; "
    code += "runpy.run_path('check_stage.py', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_reproducer_rechecks_the_guilty_stage_without_labkit(smollm, tmp_path):
    run = smollm.run(PROMPTS[0], patch={"blk.9.ffn_gate": lambda a, st: a * 1.001})
    att = labkit.attribute(run, smollm)
    rep = att.repro("blk.9.ffn_gate", out=tmp_path / "bug")
    assert rep.guilty and {"inputs.npz", "stage.json", "check_stage.py", "test_backend_ops.json"} <= set(rep.files)
    done = _check(rep.directory)
    assert done.returncode == 1 and "OUTSIDE the band" in done.stdout, done.stdout + done.stderr
    spec = json.loads((rep.directory / "stage.json").read_text())
    assert spec["weights"]["blk.9.ffn_gate.weight"] == {"type": "Q4_1", "shape": [1536, 576], "stored": True}
    data = np.load(rep.directory / "inputs.npz")
    assert np.array_equal(data["input:blk.9.ffn_norm"], run["blk.9.ffn_norm"])
    # the same check on a clean stage of the same run passes
    ok = att.repro("blk.9.ffn_up", out=tmp_path / "fine")
    assert not ok.guilty and _check(ok.directory).returncode == 0
    with pytest.raises(InvalidArgumentError, match="not empty"):
        att.repro("blk.9.ffn_up", out=tmp_path / "fine")


@pytest.mark.slow
def test_a_segment_and_a_decode_step_reproduce_with_their_cache(smollm, tmp_path):
    ids = smollm.prompt_ids(PROMPTS[0])
    ex = smollm.executor
    state = ex.new_state(len(ids))
    past = Run(smollm.name, "gpu", ids[:-1], smollm.stages, ex.run_pass(PassRequest(ids[:-1]), state).captures)
    caps = ex.run_pass(PassRequest(ids[-1:], patch={"blk.4.attn_out": lambda a, st: a * 1.01}), state).captures
    caps = {n: a for n, a in caps.items() if not n.endswith(("attn_scores", "attn_probs", "attn_ctx"))}
    step = Run(smollm.name, "gpu", ids[-1:], smollm.stages, caps, n_past=len(ids) - 1)
    att = labkit.attribute(step, smollm, past=past)
    assert att.guilty == ["blk.4.attn_out"] and att.row("blk.4.attn_out").name == "blk.4.attn_scores … blk.4.attn_out"
    rep = att.repro("blk.4.attn_out", out=tmp_path / "step")
    assert {"past_k:4", "past_v:4"} <= set(np.load(rep.directory / "inputs.npz").files)
    done = _check(rep.directory)
    assert done.returncode == 1 and "blk.4.attn_scores … blk.4.attn_out" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.oracle
@needs_llama
def test_test_backend_ops_lines_carry_ggml_ids_and_shapes(smollm, tmp_path):
    """Each line: op type ne0..3, 16 op_params, the sources (type, ne, nb in bytes), the name."""
    from labkit.attribution.ggml_ops import op_ids

    run = smollm.run(PROMPTS[0], patch={"blk.2.ffn_up": lambda a, st: a * 1.001})
    rep = labkit.attribute(run, smollm).repro("blk.2.ffn_up", out=tmp_path / "ops")
    line = (rep.directory / "test_backend_ops.txt").read_text().split()
    T = len(run.tokens)
    assert int(line[0]) == op_ids({"MUL_MAT"})["MUL_MAT"] and line[1:6] == ["0", "1536", str(T), "1", "1"]
    assert line[6] == "16" and line[23] == "2"  # 16 op params, 2 sources
    assert line[24:33] == ["3", "576", "1536", "1", "1", "20", "360", str(360 * 1536), str(360 * 1536)]  # Q4_1
    assert line[-1] == "blk.2.ffn_up"


@pytest.mark.slow
def test_the_cli_attributes_and_writes_a_reproducer(tmp_path):
    base = [sys.executable, "-m", "labkit.cli"]
    args = ["smollm2-135m", "--prompt", PROMPTS[0], "--variant", "blk.7.rmsnorm=scale_clamp"]
    done = subprocess.run([*base, "compare", *args, "--local", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-1000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["stage"] for r in records if r["verdict"] == "guilty"] == ["blk.7.attn_norm", "blk.7.ffn_norm"]
    out = tmp_path / "repro"
    done = subprocess.run([*base, "repro", *args, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "blk.7.attn_norm" in done.stdout, done.stderr[-1000:]
    assert _check(out).returncode == 1
    done = subprocess.run([*base, "repro", "smollm2-135m", "--prompt", PROMPTS[0], "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1].startswith("labkit: error: no guilty stage")


# ----------------------------------------------------------------- figures and widgets
@pytest.mark.slow
@pytest.mark.usefixtures("gives_back_memory")
def test_the_heat_map_has_a_local_mode_and_the_stepper_shows_local_error(smollm):
    from labkit.viz import interactive, static
    from labkit.viz.common import divergence_grid
    from labkit.viz.widgets import stage_stepper

    lab = labkit.open("smollm2-135m", variants={"rmsnorm": "scale_clamp"})
    run = lab.run(PROMPTS[0])
    ref = lab.reference(PROMPTS[0])
    att = labkit.attribute(run, lab, reference=ref)
    total, local = divergence_grid(labkit.compare(run, ref)), divergence_grid(att)
    assert local.local and not total.local
    # total error fails everywhere after the first norm; local error only at the norms
    assert (~total.passed).sum() > 5 * (~local.passed).sum()
    guilty_kinds = {local.kinds[j] for _, j in np.argwhere(~local.passed)}
    assert guilty_kinds == {"attn_norm", "ffn_norm", "output_norm"}
    i, j = local.rows.index("layer 3"), local.kinds.index("ffn_up")
    assert "inherited" in local.hover[i][j] and "band" in local.hover[i][j] and "ok" in local.hover[i][j]
    assert "local error" in interactive.divergence(att).layout.title.text
    assert "first guilty: blk.0.attn_norm" in static.divergence(att).get_title()
    w = stage_stepper(run, ref, att)
    w.go("blk.0.attn_norm")
    assert "GUILTY" in w.title.value and "local" in w.title.value
    w.go("blk.0.q")
    assert "own error within its band" in w.title.value
