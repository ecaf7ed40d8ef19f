"""The interactive figures, the logit lens and the per-stage explanations, on real SmolLM2 runs.

Expected values come from elsewhere: the lens from gguf's own reader and dequantizer, ranks and
probabilities from numpy on the captured logits, hover text from the comparison's rows."""

from __future__ import annotations

import functools

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

import labkit
from labkit.captures import Run
from labkit.errors import InvalidArgumentError
from labkit.viz import figures, static
from labkit.viz.widgets import stage_explorer, stage_stepper

PROMPT = "The color of the sky is"


@pytest.fixture(scope="module")
def runs(smollm):
    good = smollm.run(PROMPT)
    ref = smollm.reference(PROMPT)
    return good, ref


@functools.cache
def _gguf_reader(path: str) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)  # 5 s a parse of SmolLM2's metadata: once per file


def _gguf_tensor(lab, name: str) -> np.ndarray:
    """A weight read by gguf's own reader and dequantized by gguf.quants (not labkit's code)."""
    reader = _gguf_reader(str(lab.path))
    t = next(t for t in reader.tensors if t.name == name)
    return dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in reversed(t.shape)])


def test_logit_lens_matches_ggufs_unembedding(smollm, runs):
    good, _ = runs
    lens = good.logit_lens()
    n_layers, T = smollm.config.n_layers, len(good.tokens)
    assert lens.Z.shape == (n_layers, T, smollm.config.vocab_size)
    E = _gguf_tensor(smollm, "token_embd.weight")
    w = _gguf_tensor(smollm, "output_norm.weight")
    rng = np.random.default_rng()
    for L, p in [(0, 0), (n_layers - 1, T - 1), (int(rng.integers(n_layers)), int(rng.integers(T)))]:
        h = good[f"blk.{L}.resid_out"][p].astype(np.float64)
        want = (h / np.sqrt(np.mean(h * h) + smollm.config.rms_eps) * w) @ E.T
        err = np.max(np.abs(lens.Z[L, p] - want)) / np.max(np.abs(want))
        assert err < 1e-5, f"layer {L} position {p}: max rel diff {err:.2e}"
        t = int(rng.integers(want.size))
        assert abs(lens.rank(t, L, p) - int(np.sum(want > want[t]))) <= 2  # float32 vs float64 near-ties
    # the last layer's lens is the model's own output (the GPU logits), up to float32 rounding
    last = lens.Z[-1, -1].astype(np.float64)
    gpu = good["logits"][-1].astype(np.float64)
    nmse = np.sum((last - gpu) ** 2) / np.sum(gpu**2)
    assert nmse < 1e-6, f"last-layer lens vs logits nmse {nmse:.2e}"
    blue = smollm.token_id(" blue")
    first = lens.first_layer_in_top(blue, 10)
    assert first is not None and all(r >= 10 for r in lens.ranks(blue)[:first]) and lens.ranks(blue)[first] < 10


def test_logit_lens_reads_the_unembedding_once_for_every_layer(runs, monkeypatch):
    """The lens unembeds all its rows in one call (each call reads the whole table); split into
    calls of 5 rows by a smaller CALL_BYTES, every row lands where it did."""
    from dataclasses import replace

    from labkit import lens as lens_module

    good, _ = runs
    calls = []
    counted = replace(good, unembed=lambda h: calls.append(len(h)) or good.unembed(h))
    one = counted.logit_lens()
    n = len(one.stages) * len(one.positions)
    assert calls == [0, n], calls  # the vocabulary's size from no rows, then every row at once
    calls.clear()
    monkeypatch.setattr(lens_module, "CALL_BYTES", 5 * 8 * one.Z.shape[-1])
    split = counted.logit_lens()
    assert calls == [0] + [5] * (n // 5) + ([n % 5] if n % 5 else []), calls
    assert np.array_equal(split.Z, one.Z), f"max |diff| {np.abs(split.Z - one.Z).max():.3g}"


def test_logit_lens_figure_shows_each_cells_winner(runs):
    good, _ = runs
    lens = good.logit_lens()
    fig = figures.logit_lens(lens)
    heat = fig.data[0]
    ids = np.argmax(lens.Z, axis=2)
    want = [[good.piece(int(i)) for i in row] for row in ids]
    assert [list(r) for r in heat.text] == want
    z = lens.Z[3, 2].astype(np.float64)
    p = np.exp(z - z.max()) / np.sum(np.exp(z - z.max()))
    assert abs(np.asarray(heat.z)[3][2] - p.max()) < 1e-6
    assert "smollm2-135m" in fig.layout.title.text and "gpu" in fig.layout.title.text
    assert "top %{text}" in heat.hovertemplate and "input %{x}" in heat.hovertemplate
    tracked = figures.tracked_tokens(lens, [ids[-1, -1], 3730 % good.logits().size])
    assert list(tracked.data[0].y) == [r + 1 for r in lens.ranks(int(ids[-1, -1]))]


def test_lens_refuses_what_it_cannot_do(runs):
    good, _ = runs
    with pytest.raises(InvalidArgumentError, match="positions"):
        good.logit_lens(positions=[99])
    bare = Run("m", "gpu", good.tokens, good.stages, good.captures)  # not through a lab
    with pytest.raises(InvalidArgumentError, match="unembedding"):
        bare.logit_lens()


def test_attention_map_hover_names_both_tokens(runs):
    good, _ = runs
    fig = figures.attention_map(good, layer=2, head=4)
    heat = fig.data[0]
    assert list(heat.x)[1] == "1 ' color'" and list(heat.y)[-1] == f"{len(good.tokens) - 1} ' is'"
    assert "query %{y}" in heat.hovertemplate and "key %{x}" in heat.hovertemplate
    m = good["blk.2.attn_probs"][4].astype(np.float64)
    z = np.asarray(heat.z, dtype=float)
    assert np.allclose(np.nan_to_num(z, nan=0.0), m, atol=1e-7)
    assert "layer 2 head 4" in fig.layout.title.text and "default kernels" in fig.layout.title.text


def test_divergence_heatmap_marks_the_first_divergence(smollm, runs):
    _, ref = runs
    try:
        smollm.use("rmsnorm", "scale_clamp")
        bad = smollm.run(PROMPT)
    finally:
        smollm.use("rmsnorm", "default")
    cmp = labkit.compare(bad, ref)
    fig = figures.divergence(cmp)
    heat = fig.data[0]
    rows, kinds = list(heat.y), list(heat.x)
    assert rows[0] == "embed" and rows[1] == "layer 0" and rows[-1] == "out"
    assert kinds[0] == "embed" and kinds.index("attn_norm") < kinds.index("q") < kinds.index("resid_out")
    first = cmp.row(cmp.first_divergence)
    i, j = rows.index("layer 0"), kinds.index("attn_norm")
    assert cmp.first_divergence == "blk.0.attn_norm"
    text = heat.text[i][j]
    assert "blk.0.attn_norm" in text and f"{first.nmse:.3g}" in text and f"{first.threshold:.3g}" in text
    assert abs(heat.z[i][j] - np.log10(first.nmse)) < 1e-9
    marker = next(d for d in fig.data if d.name == "first divergence")
    assert list(marker.x) == ["attn_norm"] and list(marker.y) == ["layer 0"]
    assert "rmsnorm=scale_clamp" in fig.layout.title.text
    static.divergence(cmp)  # the widgets' still version draws the same grid


def test_histogram_counts_outliers_beside_the_axis():
    rng = np.random.default_rng()
    v = rng.normal(size=(1, 4000)).astype(np.float32)
    v[0, rng.choice(4000, 3, replace=False)] = [35000.0, 2e4, -9e3]
    run = Run("m", "gpu", [1], ["blk.0.resid_out"], {"blk.0.resid_out": v})
    fig = figures.histogram(run, "blk.0.resid_out")
    bar = fig.data[0]
    assert max(bar.x) < 10 and min(bar.x) > -10, "the outliers must not stretch the axis"
    assert sum(bar.y) == 4000 - 3
    note = fig.layout.annotations[0].text
    assert "1 below, 2 above" in note and "max 3.5e+04" in note
    assert "count %{y}" in bar.hovertemplate and "values in %{customdata}" in bar.hovertemplate
    ax = static.histogram(run, "blk.0.resid_out")
    assert ax.get_xlim()[1] < 10 and "1 below, 2 above" in ax.get_title()


def test_logit_ranking_shows_tracked_tokens_outside_the_top_k(smollm, runs):
    good, _ = runs
    z = good["logits"][-1].astype(np.float64)
    order = np.argsort(-z)
    far = int(order[500])
    ax = figures.logit_ranking(good, k=5, track=[far])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == f"#{int(np.sum(z > z[far])) + 1} {good.piece(far)!r} (tracked)", labels
    assert labels[-1].startswith(f"#1 {good.piece(int(order[0]))!r}")


def test_explanations_in_the_widgets(smollm, runs):
    good, ref = runs
    ex = stage_explorer(good, smollm.config.n_layers)
    opts = list(ex.kind.options)
    assert opts[0] == "embed" and opts[-2:] == ["output_norm", "logits"]
    assert opts.index("attn_norm") < opts.index("q") < opts.index("attn_scores") < opts.index("ffn_down")
    ex.kind.value = "attn_probs"
    ex.layer.value = 3
    assert "blk.3.attn_probs" in ex.explanation.value and "probabilities" in ex.explanation.value
    before = ex.image.value
    ex.kind.value = "logits"
    assert ex.stage == "logits" and ex.layer.disabled and "unembedding" in ex.explanation.value
    assert ex.image.value != before
    st = stage_stepper(good, ref)
    st.go("blk.0.ffn_act")
    assert "gated linear unit" in st.explanation.value
    assert str(smollm.explain("blk.0.q")).startswith("blk.0.q: the query projection")


def test_figures_draw_their_still_twin_on_a_given_axes(runs):
    import matplotlib.pyplot as plt

    good, ref = runs
    fig, axs = plt.subplots(1, 3)
    assert figures.attention_map(good, 0, head=1, ax=axs[0]) is axs[0]
    assert figures.histogram(good, "blk.3.resid_out", ax=axs[1]) is axs[1]
    assert figures.divergence(labkit.compare(good, ref), ax=axs[2]) is axs[2]
    assert [t.get_text() for t in axs[0].get_xticklabels()][1] == "1 ' color'"
    plt.close(fig)
