"""`labkit.paths` and `labkit paths`: each serving path against the one-shot pass. A clean model keeps
every path in its band (the reference's exact, the GPU's f32); a fault that only a path exposes is
localized at its stage on that path while the one-shot pass shows nothing; the batch-invariance
table judges a kernel only where its inputs were bitwise equal."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import labkit
from labkit.errors import InvalidArgumentError
from labkit.serving_paths import parse_path

IDS = [(7 * i + 3) % 200 + 1 for i in range(19)]  # past the tiny gemma3's window of 4 many times


@pytest.fixture(scope="module")
def gemma(tiny_model):
    return labkit.open(tiny_model("gemma3", "Q8_0"))


def test_a_clean_model_keeps_every_path_in_its_band(gemma):
    report = labkit.paths(gemma, IDS, ["ubatch=7", "prefix=5", "verify=4", "ubatch=1"])
    assert [(c.path, c.engine) for c in report.checks][:2] == [("ubatch=7", "gpu"), ("ubatch=7", "reference")]
    assert all(c.in_band for c in report.checks), report.table()
    ref = [c for c in report.checks if c.engine == "reference"]
    assert all(c.worst_nmse < 1e-20 for c in ref)  # float64 arithmetic reordered, nothing more
    text = report.table()
    assert "inside the exact (1e-12)" in text and "inside the f32 band" in text and "invariant: embed" in text
    json.dumps(report.to_dict())
    # a kernel is judged where its inputs were the one-shot pass's bits: the first layer's matmuls were
    gpu = next(c for c in report.checks if c.engine == "gpu" and c.path == "ubatch=7")
    q = next(s for s in gpu.stages if s.stage == "blk.0.q")
    assert q.inputs_bitwise and q.bitwise


@pytest.mark.parametrize("family,fault,stage", [("attn_scores", "chunk_mask_from_zero", "blk.0.attn_scores"),
                                                ("attn_scores", "window_from_chunk_start", "blk.0.attn_scores"),
                                                ("rope", "positions_restart", "blk.0.q_rope")])  # fmt: skip
def test_a_chunk_fault_is_localized_on_its_path_and_invisible_one_shot(gemma, family, fault, stage):
    gemma.use(family, fault)
    try:
        one_shot = labkit.compare(gemma.run(IDS), gemma.reference(IDS))
        step = labkit.compare(gemma.decode_step(IDS), gemma.decode_step(IDS, "reference"))
        report = labkit.paths(gemma, IDS, ["ubatch=7", "prefix=5"], engines=("gpu",))
    finally:
        gemma.use(family, "default")
    assert one_shot.first_divergence is None and step.first_divergence is None  # the usual checks see nothing
    for check in report.checks:
        assert check.first_divergence == stage, (fault, check.path, check.first_divergence)


def test_a_cache_type_is_a_path_held_to_its_stages_own_bands():
    """kv=TYPE: the same model on that cache. Its reference defines the path; the GPU is inside when no stage's
    own error leaves its band (labkit.verdict); the differences from the f32 one-shot pass are what the type
    costs, from the first stage that reads the cache; a cache write fault departs at its layer's cache stage."""
    moe = labkit.open("tiny-qwen3moe")
    report = labkit.paths(moe, IDS, ["kv=q8_0", "kv=q4_0"])
    assert all(c.in_band for c in report.checks), report.table()
    assert all(c.first_difference == "blk.0.attn_scores" for c in report.checks), report.table()
    q8, q4 = (next(c for c in report.checks if c.path == p and c.engine == "reference") for p in ("kv=q8_0", "kv=q4_0"))
    cost = {c.path: next(s.nmse for s in c.stages if s.stage == "blk.0.attn_out") for c in (q8, q4)}
    assert 0 < cost["kv=q8_0"] < cost["kv=q4_0"], cost  # four bits cost more than eight
    assert "stages' own bands" in report.table()
    moe.use("blk.1.kv_cache_q8_0", "scale_per_64")
    try:
        bad = labkit.paths(moe, IDS, ["kv=q8_0"], engines=("gpu",))
        one_shot = labkit.compare(moe.run(IDS), moe.reference(IDS))
    finally:
        moe.use("blk.1.kv_cache_q8_0", "default")
    assert one_shot.passed  # an f32 cache has no cache stage to fault
    assert bad.checks[0].first_divergence in ("blk.1.k_cache", "blk.1.v_cache"), bad.table()


@pytest.mark.parametrize("spec", ["beam=4", "batch=0", "ubatch=0", "prefix", "verify=x", ""])
def test_an_unknown_path_is_refused(spec):
    with pytest.raises(InvalidArgumentError, match="unknown path"):
        parse_path(spec)
    with pytest.raises(InvalidArgumentError, match="kv='q3'"):
        parse_path("kv=q3")


def test_no_path_is_refused(gemma):
    with pytest.raises(InvalidArgumentError, match="no path given"):
        labkit.paths(gemma, IDS, [])


def test_a_path_longer_than_the_prompt_is_refused_before_any_work(gemma):
    with pytest.raises(InvalidArgumentError, match="needs more than"):
        labkit.paths(gemma, IDS[:4], ["prefix=4"])
    with pytest.raises(InvalidArgumentError, match="engines"):
        labkit.paths(gemma, IDS, ["ubatch=2"], engines=("vllm",))


def test_the_cli_prints_the_table_and_exits_1_when_a_path_departs(tiny_model):
    path = str(tiny_model("gemma3", "Q8_0"))
    cmd = [
        sys.executable,
        "-m",
        "labkit.cli",
        "paths",
        path,
        "--tokens",
        ",".join(map(str, IDS)),
        "--paths",
        "ubatch=7",
    ]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "ubatch=7" in ok.stdout and "batch invariance" in ok.stdout, ok.stderr
    bad = subprocess.run([*cmd, "--variant", "attn_scores=chunk_mask_from_zero", "--json"], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 1, bad.stderr
    checks = json.loads(bad.stdout)["checks"]
    assert {c["first_divergence"] for c in checks if c["engine"] == "gpu"} == {"blk.0.attn_scores"}
    wrong = subprocess.run([*cmd[:-1], "beam=2"], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 1 and wrong.stderr.startswith("labkit: error: unknown path")


@pytest.mark.oracle
def test_every_path_agrees_with_llama_cpp_computing_the_same_path():
    """llama.cpp's own micro-batches and kept prefix (its n_ubatch, its cache) beside labkit's: each
    GPU path passes against llama.cpp's same path, llama.cpp's path passes against the reference,
    and a chunk fault departs from llama.cpp's same path where it departs from the reference."""
    moe = labkit.open("tiny-qwen3moe")  # a file llama.cpp loads: a mixture of experts, and attention
    report = labkit.paths(moe, IDS, ["ubatch=7", "prefix=5", "verify=4", "kv=q8_0"], engines=("gpu", "llamacpp"))
    assert all(c.in_band for c in report.checks), report.table()
    gpu = [c for c in report.checks if c.engine == "gpu"]
    assert len(gpu) == 4 and all(c.against_llamacpp is None for c in gpu), report.table()
    assert "as llama.cpp's same path" in report.table()
    oracle = moe.oracle(IDS, ubatch=7, prefix=5)
    assert oracle.n_past == 5 and oracle.path == "prefix=5,ubatch=7" and oracle["logits"].shape[0] == len(IDS) - 5
    for bad_args in (dict(prefix=len(IDS)), dict(prefix=-1), dict(ubatch=0)):
        with pytest.raises(InvalidArgumentError):
            moe.oracle(IDS, **bad_args)
    moe.use("attn_scores", "chunk_mask_from_zero")
    try:
        bad = labkit.paths(moe, IDS, ["ubatch=7"], engines=("gpu", "llamacpp"))
    finally:
        moe.use("attn_scores", "default")
    assert next(c for c in bad.checks if c.engine == "gpu").against_llamacpp == "blk.0.attn_scores"
