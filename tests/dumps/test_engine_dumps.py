"""The `sglang` and `trtllm` presets on files in those engines' own layouts.

Neither engine runs without CUDA, so `python -m labkit.dumps.engine_dumps` writes their files from
a real transformers pass of the GGUF file, with real torch.save: SGLang's Pass files and its
dumper's per-tensor files, TensorRT-LLM's call-index paths with every module's inputs dumped twice
(labkit.dumps.names and labkit.dumps.steps cite the engines' sources for each name). The token
ids come from the dumps themselves. A clean run must pass `compare` and `attribute`; a fault
scaled into one module must be named at its stage.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import labkit
from labkit.captures import stage_kind
from labkit.errors import DumpsFileError, InvalidArgumentError, UnknownPresetError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the hf extra (make hf)"),
]
PROMPT = "The color of the sky is"
PRESET = {"sglang": "sglang", "sglang-dumper": "sglang", "trtllm": "trtllm"}
# stages no file of the engine holds: attention maps (fused kernels), TensorRT-LLM's rope (inside its kernel)
HIDDEN = {
    "sglang": {"attn_scores", "attn_probs", "logits"},
    "sglang-dumper": {"attn_scores", "attn_probs", "logits"},
    "trtllm": {"attn_scores", "attn_probs", "q_rope", "k_rope"},
}
UP5, V8, DOWN11, DOWN2 = ("model.layers.5.mlp.up_proj=1.001", "model.layers.8.self_attn.v_proj=1.001",
                          "model.layers.11.mlp.down_proj=1.001", "model.layers.2.mlp.down_proj=2")  # fmt: skip
# every float32 dump the tests read, (engine, scale): written by one transformers load (write_dumps)
FLOAT32 = [*((e, None) for e in sorted(PRESET)), ("sglang", UP5), ("trtllm", V8), ("sglang-dumper", DOWN11),
           ("sglang", DOWN2)]  # fmt: skip
BATCH = """
import json, sys
from pathlib import Path
from labkit.dumps.engine_dumps import DumpJob, write_dumps
gguf, tokens, jobs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
write_dumps(Path(gguf), tokens, [DumpJob(e, Path(out), "float32", tuple(map(tuple, scale))) for e, out, scale in jobs])
"""


@pytest.fixture(scope="module")
def dumps(smollm, tmp_path_factory) -> dict[tuple, Path]:
    """{(engine, dtype, scale): folder}. The float32 ones from one load in a process of its own; the
    bfloat16 one through the command line (`python -m labkit.dumps.engine_dumps`)."""
    tmp = tmp_path_factory.mktemp("engines")
    ids = smollm.prompt_ids(PROMPT)
    found, jobs = {}, []
    for i, (engine, scale) in enumerate(FLOAT32):
        found[engine, "float32", scale] = tmp / f"{engine}-float32-{i}"
        pairs = [[m, float(f)] for m, f in (scale.split("="),)] if scale else []
        jobs.append([engine, str(found[engine, "float32", scale]), pairs])
    cmd = [sys.executable, "-c", BATCH, smollm.path, json.dumps(ids), json.dumps(jobs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found["trtllm", "bfloat16", None] = tmp / "trtllm-bfloat16"
    cmd = [sys.executable, "-m", "labkit.dumps.engine_dumps", smollm.path, "--tokens", ",".join(map(str, ids))]
    cmd += ["--engine", "trtllm", "--out", str(found["trtllm", "bfloat16", None]), "--dtype", "bfloat16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return found


def _dump(dumps: dict, engine: str, dtype: str = "float32", scale: str | None = None) -> Path:
    return dumps[engine, dtype, scale]


@pytest.mark.parametrize("engine", sorted(PRESET))
def test_a_clean_engine_dump_passes_compare_and_attribute(smollm, dumps, engine):
    run = labkit.load_dumps(_dump(dumps, engine), smollm, names=PRESET[engine])  # ids from the dumps
    assert run.tokens == smollm.prompt_ids(PROMPT) and run.precision == "float32"
    ref = smollm.reference(PROMPT)
    cmp = labkit.compare(run, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    assert {stage_kind(n) for n in cmp.missing} == HIDDEN[engine], sorted(cmp.missing)[:8]
    att = labkit.attribute(run, smollm, reference=ref)
    assert att.guilty == [], att.table(only_guilty=True)
    assert all(not why.startswith("matches no stage") for why in run.unmapped.values()), run.unmapped
    assert labkit.load_dumps(_dump(dumps, engine), smollm).captures.keys() == run.captures.keys(), "auto"


def test_sglang_fused_outputs_are_split_and_q_k_put_in_gguf_order(smollm, dumps):
    """qkv_proj and gate_up_proj are column blocks; rotary_emb's (q, k) and the fused norms' (norm, sum)
    are a list; q and k come in the checkpoint's halves order and are put back in the file's pairs."""
    run = labkit.load_dumps(_dump(dumps, "sglang"), smollm, names="sglang")
    ref = smollm.reference(PROMPT)
    for stage in ("blk.3.q", "blk.3.k", "blk.3.v", "blk.3.q_rope", "blk.3.k_rope", "blk.3.ffn_up", "blk.3.resid_mid",
                  "blk.2.resid_out", "blk.29.resid_out", "output_norm"):  # fmt: skip
        got, want = np.asarray(run[stage], np.float64), np.asarray(ref[stage], np.float64)
        nmse = float(np.sum((got - want) ** 2) / np.sum(want**2))
        assert nmse < 1e-6, f"{stage}: nmse {nmse:.2e}"


@pytest.mark.parametrize(
    "engine, module, stage",
    [("sglang", "model.layers.5.mlp.up_proj", "blk.5.ffn_up"),
     ("trtllm", "model.layers.8.self_attn.v_proj", "blk.8.v"),
     ("sglang-dumper", "model.layers.11.mlp.down_proj", "blk.11.ffn_down")],
)  # fmt: skip
def test_a_fault_in_one_module_is_named_at_its_stage(smollm, dumps, engine, module, stage):
    run = labkit.load_dumps(_dump(dumps, engine, scale=f"{module}=1.001"), smollm, names=PRESET[engine])
    att = labkit.attribute(run, smollm)
    assert att.guilty == [stage], att.table(only_guilty=True)


def test_bfloat16_trtllm_dumps_are_clean_in_their_own_band(smollm, dumps):
    run = labkit.load_dumps(_dump(dumps, "trtllm", "bfloat16"), smollm, names="trtllm")
    assert run.precision == "bfloat16"
    att = labkit.attribute(run, smollm)
    assert att.guilty == [], att.table(only_guilty=True)


def test_a_folder_of_several_passes_reads_one_step(smollm, dumps, tmp_path):
    """SGLang writes Pass00000.pt, Pass00001.pt, ...: merged, a later pass would overwrite the first."""
    folder = tmp_path / "TP0_PP0_Rank0_pid7"
    folder.mkdir()
    shutil.copy(_dump(dumps, "sglang") / "TP0_PP0_Rank0_pid4242" / "Pass00000.pt", folder / "Pass00000.pt")
    shutil.copy(_dump(dumps, "sglang", scale=DOWN2) / "TP0_PP0_Rank0_pid4242"
                / "Pass00000.pt", folder / "Pass00001.pt")  # fmt: skip
    first = labkit.load_dumps(tmp_path, smollm, names="sglang")  # the root: rank 0's folder, step 0
    second = labkit.load_dumps(tmp_path, smollm, names="sglang", step=1)
    assert not np.array_equal(first["blk.2.ffn_down"], second["blk.2.ffn_down"])
    assert labkit.compare(first, smollm.reference(PROMPT)).passed
    with pytest.raises(DumpsFileError, match="steps 0–1; no step 2"):
        labkit.load_dumps(tmp_path, smollm, names="sglang", step=2)


def test_given_ids_must_agree_with_the_dumps(smollm, dumps):
    with pytest.raises(InvalidArgumentError, match="the dumps hold token ids"):
        labkit.load_dumps(_dump(dumps, "trtllm"), smollm, names="trtllm", prompt="Another prompt entirely")


def test_the_cli_compares_an_engine_folder_without_a_prompt(smollm, dumps):
    cmd = [sys.executable, "-m", "labkit.cli", "compare", "smollm2-135m", "--dumps", str(_dump(dumps, "trtllm"))]
    done = subprocess.run(
        cmd + ["--names", "trtllm", "--local", "--failed"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert "no guilty stage" in done.stdout.lower() or "guilty: none" in done.stdout.lower(), done.stdout[-1500:]


def test_a_preset_that_knows_no_layers_of_the_architecture_is_a_typed_error(gemma):
    with pytest.raises(UnknownPresetError, match="'trtllm' names know llama, qwen2, qwen3"):
        labkit.load_dumps({"x": np.zeros((2, 3), np.float32)}, gemma, names="trtllm", tokens=[2, 3])
