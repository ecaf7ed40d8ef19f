"""Small things people tripped over (issue 11's list): top tokens are tuples, one text's token id,
failure lines that say why, attention maps of a decode step at their real positions."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest

import labkit
from labkit.captures import Run
from labkit.compare import StageComparison, failure_reason
from labkit.errors import TokenizerError
from labkit.viz import figures, static


def test_top_tokens_index_unpack_and_name():
    lab = labkit.open("gemma3-270m")
    run = lab.reference("The color of the sky is", names=["logits"])
    top = run.top(3)
    piece, tid, logit, prob = top[0]
    assert top[0][1] == tid == top[0].id and top[0][0] == piece == " a"
    z = run["logits"][-1].astype(np.float64)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # the softmax, computed here, not by run.top
    assert abs(prob - p[tid]) < 1e-9 and 0.1 < prob < 0.3, prob
    assert lab.token_id(" blue") == 3730 == lab.tokenize(" blue")[-1]
    with pytest.raises(TokenizerError, match="2 tokens"):
        lab.token_id(" blue sky")


def test_failure_reason_says_greater_only_when_it_is():
    over = StageComparison("blk.0.q", 3.1e-2, 1.0, 1e-5, False, "nmse")
    inf = StageComparison("blk.0.attn_scores", 3.111e-14, 0.0, 1e-5, False, "inf mismatch")
    assert failure_reason(over) == "nmse 3.100e-02 > 1e-05"
    assert failure_reason(inf) == "inf mismatch (nmse 3.111e-14, threshold 1e-05)" and ">" not in failure_reason(inf)


def test_attention_map_of_a_decode_step_labels_its_real_position():
    """One decode step after 6 cached positions: one query row, at position 6, over 7 keys."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(7), size=(4, 1)).astype(np.float32)  # [heads, 1 query, 7 keys]
    run = Run("m", "gpu", [42], ["blk.0.attn_probs"], {"blk.0.attn_probs": probs}, n_past=6)
    labels = ["<bos>", "The", " color", " of", " the", " sky", " is"]
    ax = static.attention_map(run, 0, head=1, labels=labels)
    ys = [t.get_text() for t in ax.get_yticklabels()]
    assert ys == ["6 ' is'"], ys
    xs = [t.get_text() for t in ax.get_xticklabels()]
    assert xs[0] == "0 '<bos>'" and xs[-1] == "6 ' is'" and len(xs) == 7
    ax = static.attention_map(run, 0)  # no labels: positions only
    assert [t.get_text() for t in ax.get_yticklabels()] == ["6"]
    fig = figures.attention_map(run, 0, head=1, labels=labels)  # plotly: the same rows and columns
    heat = fig.data[0]
    assert list(heat.y) == ["6 ' is'"] and list(heat.x) == xs, (heat.y, heat.x)
    np.testing.assert_allclose(np.asarray(heat.z, float)[0], probs[1, 0], rtol=1e-6)
    assert list(figures.attention_map(run, 0).data[0].y) == ["6"]


def test_variant_switcher_follows_the_lab(tiny_model):
    """Another cell's lab.use moves the dropdowns, and the shown result says it is stale."""
    from labkit.viz.widgets import variant_switcher

    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    ids = [1, 5, 9, 7, 3]
    ref = lab.reference(ids)

    def rerun(selection):
        for family, name in selection.items():
            lab.use(family, name)
        return lab.run(ids)

    sw = variant_switcher({"rope": ["default", "normal_pairs"], "softmax": ["default", "no_max_sub"]}, rerun,
                          reference=ref, lab=lab)  # fmt: skip
    sw.select({"rope": "normal_pairs"})
    assert sw.selection == {"rope": "normal_pairs", "softmax": "default"}
    assert sw.last_comparison.first_divergence is not None
    lab.use("rope", "default")  # "the next cell puts the lab back to defaults"
    assert sw.selection == {"rope": "default", "softmax": "default"}
    assert "changed since the result below" in sw.status.value
    lab.use("softmax", "no_max_sub")
    assert sw.selection["softmax"] == "no_max_sub"


def test_stage_stepper_pauses_where_it_is_and_has_a_speed():
    from labkit.viz.widgets import stage_stepper

    rng = np.random.default_rng(1)
    names = ["embed", "blk.0.attn_norm", "blk.0.q", "output_norm"]
    run = Run("m", "gpu", [1, 2, 3], names, {n: rng.standard_normal((3, 8)).astype(np.float32) for n in names})
    st = stage_stepper(run)
    st.play.value = True  # no running event loop here: drive the ticks by hand
    assert st.play.description == "pause"
    assert st.tick() and st.tick() and st.stage == "blk.0.q"
    st.play.value = False  # pause: the stage stays
    assert st.stage == "blk.0.q" and st.play.description == "play"
    st.play.value = True
    assert st.tick() and st.stage == "output_norm"
    assert not st.tick() and st.play.value is False  # at the end it stops by itself
    st.play.value = True  # play from the end starts over
    assert st.stage == "embed"
    assert 0.3 < st.speed.value < 40
