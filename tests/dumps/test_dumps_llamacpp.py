"""llama.cpp's real tensors, dumped by scripts/dump_llamacpp.py (its eval callback, nothing of
labkit) in llama.cpp's own names and 4-d layout, loaded with names="llamacpp" as they are on
disk; a copy of each real model with blk.3.ffn_up's block scales sign-flipped (a converter
bug) is localized to blk.3.ffn_up, and `diff-weights` names the corrupted tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import labkit
from labkit.compare import stage_kind
from labkit.model.corrupt import flip_scale_signs
from labkit.oracle import llamacpp
from labkit.precision import REFERENCE_THRESHOLDS

from conftest import _open_cached, needs_llama

ROOT = Path(__file__).resolve().parents[2]
SKY = "The color of the sky is"
pytestmark = needs_llama


def dump(model_path, out: Path, *args: str) -> Path:
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dump_llamacpp.py"), str(model_path), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory):
    """{model: (lab, original dump, corrupted gguf, corrupted dump)} for both real models."""
    out, d = {}, tmp_path_factory.mktemp("llamacpp-dumps")
    for model in ("gemma3-270m", "smollm2-135m"):
        lab = _open_cached(model)  # the session's lab: its reference weights are shared with other tests
        bad = flip_scale_signs(lab.path, d / f"{model}-bad.gguf", "blk.3.ffn_up.weight")
        out[model] = (
            lab,
            dump(lab.path, d / f"{model}.npz", "--prompt", SKY),
            bad,
            dump(bad, d / f"{model}-bad.npz", "--prompt", SKY),
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_real_llamacpp_dumps_pass_and_a_corrupted_tensor_is_found_at_its_stage(model, corrupted):
    lab, good, bad_gguf, bad = corrupted[model]
    ref = lab.reference(SKY)
    with np.load(good) as z:  # llama.cpp's names and layout, as on disk
        assert "attn_norm-0" in z.files and z["attn_norm-0"].ndim == 4
    run = labkit.load_dumps(good, lab, names="llamacpp", prompt=SKY)
    assert run.precision == "int8-activations" and run.tokens == ref.tokens
    cmp = labkit.compare(run, ref)  # no thresholds=: picked from the two precisions
    assert cmp.passed, cmp.table(only_failed=True)
    assert len(cmp.rows) >= 0.9 * len(lab.stages), cmp.missing
    # llama.cpp pruned its last layer's FFN to the last position: kept as that position, not dropped
    last = f"blk.{lab.config.n_layers - 1}.ffn_down"
    assert run.positions[last] == (len(ref.tokens) - 1,) and cmp.row(last).positions == (len(ref.tokens) - 1,)
    assert "node_" in " ".join(run.unmapped)  # unnamed nodes are reported, not dropped
    cmp = labkit.compare(labkit.load_dumps(bad, lab, names="llamacpp", prompt=SKY), ref)
    assert cmp.first_divergence == "blk.3.ffn_up", cmp.table(only_failed=True)
    diff = labkit.diff_weights(bad_gguf, lab.path)
    assert diff.first_difference == "blk.3.ffn_up.weight" and len(diff.differing) == 1, diff.table()
    row = diff.differing[0]
    assert (
        row.blocks_differing == lab.gguf.tensors["blk.3.ffn_up.weight"].nbytes // {"Q5_0": 22, "Q4_1": 20}[row.type_a]
    )
    if row.type_a == "Q5_0":  # d·q negated: |a-b|² = 4b² (Q4_1's min m keeps its sign)
        assert row.nmse == pytest.approx(4.0, rel=1e-6)


@pytest.mark.slow
def test_cli_compare_dumps_by_tokens_prints_the_first_divergence_first(corrupted):
    lab, _, _, bad = corrupted["smollm2-135m"]
    ids = ",".join(map(str, lab.tokenize(SKY)))
    p = cli("compare", "smollm2-135m", "--tokens", ids, "--dumps", str(bad), "--names", "llamacpp", "--json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    assert data["first_divergence"] == "blk.3.ffn_up" and data["passed"] is False
    assert data["first_divergence_position"] is not None and "int8-activations" in data["thresholds"]
    assert {"first_divergence", "passed", "stages", "missing", "unmapped"} <= set(data)
    p = cli("compare", "smollm2-135m", "--prompt", SKY, "--dumps", str(bad), "--names", "llamacpp", "--failed")
    assert p.stdout.splitlines()[0].startswith("first divergence: blk.3.ffn_up at position"), p.stdout[:300]


@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2", "qwen3", "gemma2", "phi3"])
def test_llamacpp_preset_reads_the_same_tensors_as_the_oracle(arch, llama_loadable_tiny, tmp_path):
    """Every stage the preset maps holds what the oracle (which reads llama.cpp's graph itself,
    scale and mask included) holds: the dump's kq scaled and masked by labkit equals the oracle's."""
    lab = labkit.open(llama_loadable_tiny(arch))
    ids = [1, 5, 9, 33, 2, 7, 11, 4, 3, 8]  # longer than gemma's tiny window of 4
    path = dump(lab.path, tmp_path / "d.npz", "--tokens", ",".join(map(str, ids)), "--all-logits")
    mine, orc = labkit.load_dumps(path, lab, names="llamacpp", tokens=ids), lab.oracle(ids)
    cmp = labkit.compare(mine, orc, thresholds={k: 1e-12 for k in REFERENCE_THRESHOLDS})
    assert cmp.passed, cmp.table(only_failed=True)
    # only the stages the oracle finds by what their (unnamed) node reads: a dump has no such link
    by_reads = {kind for kind, pick in llamacpp.MAPPINGS[arch].items() if pick.reads} | set(
        llamacpp.NO_COUNTERPART[arch]
    )
    assert {stage_kind(n) for n in cmp.missing} <= by_reads, cmp.missing
