"""The `hf` preset on the library's own output: real transformers passes of the real GGUF files.

transformers loads each model's GGUF file itself and forward hooks dump every module
(labkit.dumps.hf_hooks, in a subprocess: torch's memory leaves with it; one load serves every
pass of a model and dtype), saved by
real torch as .pt files that labkit reads without torch. A clean run must pass `compare` and
name no guilty stage in `attribute`; a fault injected into one module must be named at that
module's stage, or at the segment holding it when hooks cannot see the stage.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import labkit
from labkit.captures import stage_kind

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the hf extra (make hf)"),
]
PROMPT = "The color of the sky is"
HIDDEN = {"q_rope", "k_rope", "attn_scores", "attn_probs", "attn_ctx", "resid_mid", "ffn_act"}  # no module's output
UP5, ACT4, UP5_BF16 = (
    "model.layers.5.mlp.up_proj=1.001",
    "model.layers.4.mlp.act_fn=1.01",
    "model.layers.5.mlp.up_proj=1.05",
)
# SmolLM2's dumps the tests read, (dtype, scale): one transformers load per dtype, one pass per fault
SMOLLM = [("float32", None), ("float32", UP5), ("float32", ACT4), ("bfloat16", None), ("bfloat16", UP5_BF16)]
BATCH = """
import json, sys
from pathlib import Path
from labkit.dumps.hf_hooks import hooked_pass, load_model, save
gguf, tokens, jobs = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
for dtype in dict.fromkeys(d for d, _, _ in jobs):
    model = load_model(gguf, dtype)
    for d, out, scale in jobs:
        if d == dtype:
            save(hooked_pass(model, tokens, dict(scale))[0], Path(out))
"""


@pytest.fixture(scope="module")
def dumps(smollm, gemma, tmp_path_factory) -> dict[tuple, Path]:
    """{(model, dtype, scale): .pt file}. SmolLM2's from one process (hooked_pass on one load per
    dtype); Gemma's through the command line (`python -m labkit.dumps.hf_hooks`)."""
    tmp = tmp_path_factory.mktemp("hf")
    found, jobs = {}, []
    for i, (dtype, scale) in enumerate(SMOLLM):
        found[smollm.name, dtype, scale] = tmp / f"smollm-{dtype}-{i}.pt"
        pairs = [[m, float(f)] for m, f in (scale.split("="),)] if scale else []
        jobs.append([dtype, str(found[smollm.name, dtype, scale]), pairs])
    ids = json.dumps(smollm.prompt_ids(PROMPT))
    done = subprocess.run([sys.executable, "-c", BATCH, smollm.path, ids, json.dumps(jobs)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found[gemma.name, "float32", None] = tmp / "gemma.pt"
    ids = ",".join(map(str, gemma.prompt_ids(PROMPT)))
    cmd = [sys.executable, "-m", "labkit.dumps.hf_hooks", gemma.path, "--tokens", ids, "--out", str(tmp / "gemma.pt")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return found


def _dump(dumps: dict, lab, dtype: str = "float32", scale: str | None = None) -> Path:
    return dumps[lab.name, dtype, scale]


@pytest.mark.parametrize("real_lab", ["smollm2-135m", "gemma3-270m"], indirect=True)
def test_a_clean_transformers_run_passes_compare_and_attribute(real_lab, dumps):
    lab = real_lab
    run = labkit.load_dumps(_dump(dumps, lab), lab, names="hf", prompt=PROMPT)
    assert run.precision == "float32"
    ref = lab.reference(PROMPT)
    cmp = labkit.compare(run, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    assert {stage_kind(n) for n in cmp.missing} == HIDDEN
    att = labkit.attribute(run, lab, reference=ref)
    assert att.guilty == [], att.table(only_guilty=True)
    assert att.row("blk.0.attn_out").name == "blk.0.q_rope … blk.0.attn_out"


def test_a_fault_in_one_module_is_named_at_its_stage(smollm, dumps):
    run = labkit.load_dumps(_dump(dumps, smollm, scale=UP5), smollm, "hf", prompt=PROMPT)
    att = labkit.attribute(run, smollm)
    assert att.guilty == ["blk.5.ffn_up"], att.table(only_guilty=True)


def test_a_fault_hooks_cannot_see_is_named_at_its_segment(smollm, dumps):
    """act_fn's output (act(gate) alone) is no labkit stage: the fault lands in ffn_act … ffn_down."""
    run = labkit.load_dumps(_dump(dumps, smollm, scale=ACT4), smollm, "hf", prompt=PROMPT)
    att = labkit.attribute(run, smollm)
    assert att.guilty == ["blk.4.ffn_down"], att.table(only_guilty=True)
    assert att.row("blk.4.ffn_down").name == "blk.4.ffn_act … blk.4.ffn_down"


def test_bfloat16_dumps_localize_a_five_percent_fault(smollm, dumps):
    """In bf16, total-error compare cannot see a 5 % fault at one stage; attribute names it."""
    ref = smollm.reference(PROMPT)
    clean = labkit.load_dumps(_dump(dumps, smollm, "bfloat16"), smollm, "hf", prompt=PROMPT)
    assert clean.precision == "bfloat16"
    assert labkit.attribute(clean, smollm, reference=ref).guilty == []
    bad_path = _dump(dumps, smollm, "bfloat16", UP5_BF16)
    bad = labkit.load_dumps(bad_path, smollm, "hf", prompt=PROMPT)
    assert labkit.compare(bad, ref).passed, "the bf16 table hides a 5 % fault: the reason for attribution"
    att = labkit.attribute(bad, smollm, reference=ref)
    assert att.guilty == ["blk.5.ffn_up"], att.table(only_guilty=True)


# transformers builds a GGUF file's config from a few metadata keys and takes its defaults for the
# rest: qwen3's head_dim (128), the gemmas' query_pre_attn_scalar (256), gemma2's soft-caps (50, 30),
# gemma3's sliding-window pattern (every 6th layer global), phi3's pad id (32000). Real checkpoints
# have those values; the tiny files are written with them, so both engines read the same model.
TRANSFORMERS_DEFAULTS = {
    "llama": {},
    "qwen2": {},
    "qwen3": dict(head_dim=128),
    "gemma2": dict(head_dim=256, attn_softcap=50.0, final_softcap=30.0),
    "gemma3": dict(head_dim=256, n_layers=6, swa_pattern=6),
    "phi3": dict(vocab=32064),
}


@pytest.mark.parametrize("arch", sorted(TRANSFORMERS_DEFAULTS))
def test_every_architecture_transformers_loads_passes_the_hf_preset(arch, tmp_path):
    """Each architecture labkit runs, loaded from GGUF by transformers itself: the hf preset's
    names, fused tensors (phi3's qkv and gate_up), q/k row order and norms hold on its real output."""
    from labkit.model.tiny import TinySpec, write_tiny_model

    spec = TinySpec(arch=arch, weight_type="F32", embed_type="F32", **TRANSFORMERS_DEFAULTS[arch])
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", spec)
    lab = labkit.open(str(path))
    ids = [5, 17, 33, 2, 99, 7, 250, 64]
    out = tmp_path / "dump.pt"
    cmd = [sys.executable, "-m", "labkit.dumps.hf_hooks", str(path), "--tokens", ",".join(map(str, ids))]
    cmd += ["--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = labkit.load_dumps(out, lab, names="hf", tokens=ids)
    ref = lab.reference(ids)
    cmp = labkit.compare(run, ref)
    assert cmp.passed, cmp.table(only_failed=True)
    assert len(cmp.rows) >= 10 * spec.n_layers, f"only {len(cmp.rows)} stages compared"
    att = labkit.attribute(run, lab, reference=ref)
    assert att.guilty == [], att.table(only_guilty=True)
