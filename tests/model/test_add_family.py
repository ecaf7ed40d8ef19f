"""The "add an architecture" recipe, as one file: a family is an ArchTraits row. Registered here
(never in the package), it gets its stage graph, a file from labkit's writer (its tensors read off
the graph), both engines, the memory plan and compare, with no other code.

The family is made up (llama.cpp cannot run it, so there is no oracle check): a qwen3-like model
with gpt-oss's attention sinks and output bias, every third layer global.
"""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.compare import compare
from labkit.errors import UnsupportedArchitectureError
from labkit.model.arch_traits import ARCHITECTURES, ArchTraits
from labkit.model.gguf_file import open_gguf
from labkit.model.tiny import TinySpec, write_tiny_model

DEMO = ArchTraits(
    "neox", qk_norm=True, attn_sinks=True, swa_pattern=3, biases=("attn_q", "attn_k", "attn_v", "attn_output")
)
IDS = [5, 80, 3, 17, 250, 9, 41, 7, 120]


@pytest.fixture
def demo_path(monkeypatch, tmp_path):
    monkeypatch.setitem(ARCHITECTURES, "labkit-demo", DEMO)
    spec = TinySpec(arch="labkit-demo", n_layers=3, swa_pattern=3, seed=3)
    return write_tiny_model(tmp_path / "demo.gguf", spec, merges=["<t1> <t2>"])


def test_a_family_is_one_row(demo_path):
    tensors = open_gguf(demo_path).tensors
    for name in ("blk.0.attn_sinks.weight", "blk.0.attn_output.bias", "blk.2.attn_q.bias", "blk.1.attn_q_norm.weight"):
        assert name in tensors, name
    assert "blk.0.attn_sub_norm.weight" not in tensors and "output.weight" not in tensors
    lab = labkit.open(demo_path)
    assert lab.config.swa_layers == (True, True, False)
    gpu, ref = lab.run(IDS), lab.reference(IDS)
    cmp = compare(gpu, ref)
    assert cmp.passed and not cmp.missing, cmp.table(only_failed=True)
    rows = np.asarray(gpu["blk.2.attn_probs"]).sum(axis=-1)
    assert np.all(rows < 1.0), "the sinks take a share of every row"
    assert lab.memory(tokens=16).parts


def test_an_unregistered_family_is_refused(demo_path, monkeypatch):
    monkeypatch.delitem(ARCHITECTURES, "labkit-demo")
    with pytest.raises(UnsupportedArchitectureError, match="labkit-demo"):
        labkit.open(demo_path)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_stage_of_every_family_says_what_it_does(tiny_model, arch):
    """Each stage kind's role comes from its row of the stage-kind table, whichever op computes it:
    every stage of every family explains its job (BitNet's sub-norms and the MoE router included)."""
    lab = labkit.open(tiny_model(arch, "TQ2_0" if arch == "bitnet" else "Q8_0"))
    silent = [st.name for st in lab.graph if not lab.explain(st.name).role]
    assert not silent, f"{arch}: stages with no role: {silent}"
    assert lab.explain(lab.graph[-1].name).role.startswith("the unembedding")
