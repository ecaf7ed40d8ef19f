"""A kernel of one's own tried on the model (labkit.kernel_trial): a correct one passes, a wrong one
is named at its stages by attribution, the lab's selection is left as it was, and a timing that
finds no stage of the asked kinds says so."""

from __future__ import annotations

import pytest

import labkit
from labkit.errors import InvalidArgumentError, ShaderCompileError
from labkit.kernel_trial import time_kernels, try_kernel

IDS = [1, 5, 9, 33, 2, 71]
# one workgroup of one invocation a group: the simplest RMSNorm (lesson 11's exercise 11.2)
RMSNORM = """
struct Params { n_groups: u32, group: u32, eps: f32, _pad: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.n_groups) { return; }
    let base = g * P.group;
    var s = 0.0;
    for (var i = 0u; i < P.group; i++) { s += X[base + i] * X[base + i]; }
    let inv = 1.0 / sqrt(s / f32(P.group) + P.eps);
    for (var i = 0u; i < P.group; i++) { Y[base + i] = X[base + i] * inv * W[i]; }
}
"""


@pytest.fixture(scope="module")
def lab(tiny_model):
    return labkit.open(tiny_model("llama", "Q8_0"))


def test_a_correct_kernel_passes_and_a_wrong_one_is_named_at_its_stages(lab):
    ref = lab.reference(IDS)
    good = try_kernel(lab, IDS, "rmsnorm", RMSNORM, "test_one_thread", reference=ref)
    assert good.correct and good.first_divergence is None, good.text()
    wrong = try_kernel(lab, IDS, "rmsnorm", RMSNORM.replace(" * W[i]", " * (1.0 + W[i])"), "test_offset", reference=ref)
    assert not wrong.correct and wrong.first_divergence == "blk.0.attn_norm"
    assert wrong.guilty and all(s.rsplit(".", 1)[-1].endswith("norm") for s in wrong.guilty), wrong.guilty
    assert "departs at blk.0.attn_norm" in wrong.text() and lab.selected == {}
    with pytest.raises(ShaderCompileError, match="line"):
        try_kernel(lab, IDS, "rmsnorm", RMSNORM.replace("sqrt(", "sqrtt("), "test_typo", reference=ref)


def test_kernel_times_alternate_variants_and_refuse_kinds_never_timed(lab):
    try_kernel(lab, IDS, "rmsnorm", RMSNORM, "test_one_thread")
    times = time_kernels(lab, IDS, "rmsnorm", ["default", "test_one_thread"], ("attn_norm", "ffn_norm"), repeats=2)
    assert [len(v) for v in times.ms.values()] == [2, 2] and all(ms > 0 for v in times.ms.values() for ms in v)
    assert times.ratio("test_one_thread", "default") == times.median("test_one_thread") / times.median("default")
    with pytest.raises(InvalidArgumentError, match="no stage of attn_nrom"):
        time_kernels(lab, IDS, "rmsnorm", ["default"], ("attn_nrom",), repeats=1)
    assert lab.selected == {}
