"""labkit.viz and the rich displays: fast, on synthetic Runs (no GPU) and one tiny model.

The widgets are driven the way a notebook user drives them: set a slider or dropdown value, click a
button, and check what the widget now shows (or what the callback was called with). They render
into HTML and Image widgets, so all of this works without a kernel."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import labkit
from labkit.captures import POISON_BITS, Run
from labkit.viz import array_summary, figures, widgets

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG"
KINDS = ("attn_norm", "attn_scores", "attn_probs", "attn_out", "resid_out")
N_LAYERS, HEADS, T, D, VOCAB = 2, 3, 5, 8, 16


def piece(i: int) -> str:
    return {0: "<bos>", 3: " blue", 4: " a&b"}.get(i, f"t{i}")


def make_run(seed: int = 0, engine: str = "gpu", **kw) -> Run:
    rng = np.random.default_rng(seed)
    stages = ["embed"] + [f"blk.{L}.{k}" for L in range(N_LAYERS) for k in KINDS] + ["logits"]
    caps = {}
    mask = np.triu(np.ones((T, T), bool), 1)
    for s in stages:
        if s.endswith("attn_scores"):
            caps[s] = np.where(mask, -np.inf, rng.normal(size=(HEADS, T, T))).astype(np.float32)
        elif s.endswith("attn_probs"):
            z = np.exp(np.where(mask, -np.inf, rng.normal(size=(HEADS, T, T))))
            caps[s] = (z / z.sum(-1, keepdims=True)).astype(np.float32)
        elif s == "logits":
            z = rng.normal(size=(T, VOCAB)).astype(np.float32)
            z[-1, 3], z[-1, 4] = 9.0, 8.0  # ' blue' then ' a&b' at the last position
            caps[s] = z
        else:
            caps[s] = rng.normal(size=(T, D)).astype(np.float32)
    return Run("synthetic", engine, [0, 1, 2, 5, 6], stages, caps, piece=piece, **kw)


def diverged(from_stage: str, seed: int = 0, **kw) -> Run:
    """A run equal to make_run(seed) up to `from_stage`, different from there on."""
    r = make_run(seed, **kw)
    i = r.stages.index(from_stage)
    for s in r.stages[i:]:
        r.captures[s] = r.captures[s] * 1.5 + 0.5
    return r


# ----- rich displays


def test_run_repr_html_shows_pieces_top_tokens_and_counts():
    r = make_run(timings={"total_s": 0.25, "recomputed_from": "blk.1.attn_norm"}, variants={"rope": "normal_pairs"})
    h = r._repr_html_()
    assert "synthetic" in h and "gpu" in h and f"{len(r.captures)}/{len(r.stages)} stages captured" in h
    assert "&lt;bos&gt;" in h and "<bos>" not in h  # pieces are shown, escaped
    assert "&#x27; blue&#x27;" in h and "&#x27; a&amp;b&#x27;" in h  # the top tokens, as repr
    assert h.index("blue") < h.index("a&amp;b")  # ranked
    assert "blk.1.attn_norm" in h and "rope=normal_pairs" in h and "0.25 s" in h
    assert "no NaN, inf or unwritten" in h  # masked -inf scores are not a fault


def test_run_repr_html_flags_nan_inf_and_unwritten_stages():
    r = make_run()
    r.captures["blk.0.attn_out"][2, 3] = np.nan
    r.captures["blk.1.resid_out"][0, 0] = np.inf
    poisoned = r.captures["logits"].copy()
    poisoned.view(np.uint32)[:, -4:] = POISON_BITS
    r.captures["logits"] = poisoned
    r.unwritten.update({s: 0 for s in r.stages} | {"logits": 4 * T})
    h = r._repr_html_()
    assert "3 stage(s) with NaN, inf or unwritten" in h and "first: <code>blk.0.attn_out</code>" in h
    assert "blk.1.resid_out" in h and "debug" in h and str(4 * T) in h
    assert f">{4 * T}</td>" in h  # the logits row's unwritten cell, not some bar width


def test_run_repr_html_without_logits():
    r = make_run()
    del r.captures["logits"]
    assert "no logits captured" in r._repr_html_()


def test_stats_repr_html_marks_bad_counts():
    r = make_run()
    r.captures["embed"][1, 1] = np.nan
    h = r.stats("embed", pos=1)._repr_html_()
    assert "embed[pos=1]" in h and "color:#c00" in h
    assert "color:#c00" not in r.stats("embed", pos=0)._repr_html_()


def test_run_at_stats_masked_and_top():
    r = make_run()
    scores = r["blk.0.attn_scores"]
    assert np.array_equal(r.at("blk.0.attn_scores", 1), scores[:, 1]) and r.at("embed", 2).shape == (D,)
    assert r.at("embed", None) is r["embed"]
    masked = HEADS * T * (T - 1) // 2
    s = r.stats("blk.0.attn_scores")
    assert s.masked == masked and s.inf == masked and f"masked={masked}" in str(s)
    assert r.stats("blk.0.attn_scores", pos=0).masked == HEADS * (T - 1)
    assert r.stats("blk.0.attn_probs").masked == 0 and r.stats("embed").masked == 0
    z = r.logits()
    assert [t.id for t in r.top(3)] == list(np.argsort(-z, kind="stable")[:3])
    assert [t.id for t in r.top(VOCAB + 5)] == list(np.argsort(-z, kind="stable"))  # k above the vocab
    r.captures["logits"][-1] = 1.0  # all tied: the lower ids first, as a stable sort gives them
    assert [t.id for t in r.top(4)] == [0, 1, 2, 3] and abs(r.top(1)[0].prob - 1 / VOCAB) < 1e-12


def test_array_summary_of_hidden_states_attention_and_one_position():
    r = make_run()
    r.captures["blk.0.resid_out"][3, 5] = np.nan
    s = array_summary(r, "blk.0.resid_out")
    assert s.image.startswith(PNG) and s.stats.nan == 1 and s.row_bad == [0, 0, 0, 1, 0]
    assert s.rows[0] == "0 '<bos>'" and len(s.row_rms) == T
    h = s._repr_html_()
    assert "float32[5, 8]" in h and "nan=1" in h and "<svg" in h and "data:image/png;base64," in h
    scores = array_summary(r, "blk.1.attn_scores")
    assert scores.masked == HEADS * T * (T - 1) // 2 and "inf=0" in scores.html and scores.row_bad == [0] * T
    assert scores.kind == "attn_scores" and f"masked (-inf)={scores.masked}" in scores.html
    probs = array_summary(r, "blk.1.attn_probs", pos=-1)  # one query row: [heads, k]
    assert probs.rows == [f"head {h}" for h in range(HEADS)] and probs.stats.shape == (HEADS, T)
    assert "colors: 0..1" in probs.html and "colors: 0..1" not in h
    r.captures["blk.0.resid_out"][1, 2] = np.inf
    r.captures["blk.0.resid_out"][1, 3] = -np.inf
    s = array_summary(r, "blk.0.resid_out")
    assert s.row_bad == [0, 2, 0, 1, 0] and s.stats.inf == 2 and "inf=2" in s.html
    row = r["blk.0.resid_out"][0].astype(np.float64)
    assert np.isclose(s.row_rms[0], np.sqrt(np.mean(row**2)))


def test_array_summary_pools_wide_rows_without_losing_a_nan():
    r = make_run()
    wide = np.random.default_rng(1).normal(size=(T, 5000)).astype(np.float32)
    wide[2, 4321] = np.nan
    r.captures["logits"] = wide
    s = array_summary(r, "logits")
    assert s.pooled > 1 and s.row_bad[2] == 1
    import io

    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(s.image)))
    assert img.shape[1] <= figures.MAX_COLS and img.shape[1] == s.width
    assert (img[2] == figures.NAN_RGB).all(axis=-1).any() and not (img[1] == figures.NAN_RGB).all(axis=-1).any()


# ----- widgets


def test_stage_explorer_redraws_on_every_control():
    r = make_run()
    w = widgets.stage_explorer(r, N_LAYERS)
    assert w.stage == "blk.0.resid_out" and bytes(w.image.value).startswith(PNG)
    assert "blk.0.resid_out[pos=4]" in w.stats.value
    before = bytes(w.image.value)
    w.layer.value = 1
    assert "blk.1.resid_out[pos=4]" in w.stats.value and bytes(w.image.value) != before
    w.kind.value = "attn_probs"
    w.pos.value = 0
    assert "blk.1.attn_probs[pos=0]" in w.stats.value and "&#x27;&lt;bos&gt;&#x27;" in w.stats.value
    assert "blk.1.attn_probs" in w.summary.value
    assert "labkit-stage-explorer" in w._dom_classes


def test_stage_explorer_builds_a_stage_summary_once(monkeypatch):
    built = []
    summary = figures.array_summary
    monkeypatch.setattr(figures, "array_summary", lambda run, name: built.append(name) or summary(run, name))
    w = widgets.stage_explorer(make_run(), N_LAYERS)
    for p in (0, 1, 2):
        w.pos.value = p
    w.layer.value = 1
    w.layer.value = 0
    assert built == ["blk.0.resid_out", "blk.1.resid_out"], "not again per position, nor on coming back"


def test_attention_explorer_layer_head_scores_and_all_heads():
    r = make_run()
    w = widgets.attention_explorer(r, N_LAYERS, labels=[piece(t) for t in r.tokens])
    assert w.head.max == HEADS - 1 and w.stage == "blk.0.attn_probs" and bytes(w.image.value).startswith(PNG)
    seen = {bytes(w.image.value)}
    w.head.value = 2
    seen.add(bytes(w.image.value))
    w.layer.value = 1
    seen.add(bytes(w.image.value))
    w.values.value = "scores"
    assert w.stage == "blk.1.attn_scores"
    seen.add(bytes(w.image.value))
    w.all_heads.value = True
    assert w.head.disabled
    seen.add(bytes(w.image.value))
    assert len(seen) == 5, "every change redraws something different"
    w.query.value = 0
    assert "query 0 &#x27;&lt;bos&gt;&#x27; attends most to &#x27;&lt;bos&gt;&#x27; 1.00" in w.attends.value


def test_attention_explorer_query_only_updates_what_it_attends_to(monkeypatch):
    w = widgets.attention_explorer(make_run(), N_LAYERS)
    drawn = []
    monkeypatch.setattr(widgets, "png", lambda fig: drawn.append(fig) or b"")
    before = w.attends.value
    w.query.value = 1
    assert drawn == [] and "query 1" in w.attends.value and w.attends.value != before
    w.head.value = 1
    assert len(drawn) == 1 and "head 1: query 1" in w.attends.value


def test_attention_explorer_without_attention_maps_says_why():
    r = make_run()
    for L in range(N_LAYERS):
        del r.captures[f"blk.{L}.attn_probs"], r.captures[f"blk.{L}.attn_scores"]
    w = widgets.attention_explorer(r, N_LAYERS)
    assert bytes(w.image.value) == b"" and "fused attention variant" in w.attends.value


FAMILIES = {"rope": ["default", "normal_pairs"], "softmax": ["default", "no_max_sub"], "add": ["default"]}
DOCS = {"rope": {"normal_pairs": "normal (2i, 2i+1) rope whatever the model's style"}}
FAULTY = {"rope": ["normal_pairs"], "softmax": ["no_max_sub"]}


def fake_rerun(calls: list):
    def rerun(selection: dict[str, str]) -> Run:
        calls.append(selection)
        bad = {f: n for f, n in selection.items() if n != "default"}
        timings = {"total_s": 0.5, "recomputed_from": "blk.1.attn_scores" if bad else "embed"}
        return diverged("blk.1.attn_scores", timings=timings) if bad else make_run(timings=timings)

    return rerun


def test_variant_switcher_calls_back_with_the_full_selection_and_shows_the_divergence():
    calls: list = []
    ref = make_run(engine="reference")
    w = widgets.variant_switcher(FAMILIES, fake_rerun(calls), ref, docs=DOCS, faulty=FAULTY)
    assert list(w.dropdowns) == ["rope", "softmax"], "a family with one variant gets no dropdown"
    labels = dict((v, k) for k, v in w.dropdowns["rope"].options)
    assert labels["normal_pairs"].startswith("⚠ normal_pairs: normal (2i, 2i+1)") and labels["default"] == "default"
    assert calls == [], "nothing runs before the user asks"
    w.dropdowns["rope"].value = "normal_pairs"  # auto is off: a change alone does not re-run
    assert calls == [] and "normal_pairs" in w.about.value and "faulty" in w.about.value
    w.button.click()
    assert calls == [{"rope": "normal_pairs", "softmax": "default"}]
    assert "first divergence: <code>blk.1.attn_scores</code>" in w.result.value
    assert "recomputed from <code>blk.1.attn_scores</code>" in w.status.value and "0.50 s" in w.status.value
    assert bytes(w.image.value).startswith(PNG) and w.last_comparison.first_divergence == "blk.1.attn_scores"
    assert "&#x27; blue&#x27;" in w.result.value and "reference" in w.result.value
    run = w.select({})  # back to defaults, from code
    assert calls[-1] == {"rope": "default", "softmax": "default"} and w.dropdowns["rope"].value == "default"
    assert isinstance(run, Run) and "every stage within its threshold" in w.result.value
    assert "runs so far (2)" in w.runs_log.value and w.history[-1]["top1"] == " blue"
    assert widgets.variant_switcher is widgets.VariantSwitcher and "labkit-variant-switcher" in w._dom_classes
    with pytest.raises(KeyError):
        w.select({"no_such_family": "x"})


def test_variant_switcher_auto_reruns_on_change_and_shows_callback_errors():
    calls: list = []
    w = widgets.variant_switcher(FAMILIES, fake_rerun(calls), make_run(engine="reference"), auto=True)
    w.dropdowns["softmax"].value = "no_max_sub"
    assert calls == [{"rope": "default", "softmax": "no_max_sub"}]

    def broken(selection):
        raise RuntimeError("shader failed to compile")

    w2 = widgets.variant_switcher(FAMILIES, broken, make_run(engine="reference"))
    w2.button.click()
    assert "RuntimeError: shader failed to compile" in w2.status.value and not w2.button.disabled
    with pytest.raises(RuntimeError):
        w2.select({"rope": "normal_pairs"})


def test_stage_stepper_steps_and_reports_nmse():
    ref = make_run(engine="reference")
    w = widgets.stage_stepper(diverged("blk.1.attn_norm"), ref)
    assert w.stage == "embed" and "nmse" in w.title.value and "(ok)" in w.title.value
    w.step(+1)
    assert w.stage == "blk.0.attn_norm"
    w.go("blk.1.attn_norm")
    assert "FAIL" in w.title.value and "blk.1.attn_norm" in w.body.value
    w.step(-100)
    assert w.stage == "embed"
    assert "labkit-stage-stepper" in w._dom_classes


def test_stage_stepper_names_stages_the_reference_lacks():
    ref = make_run(engine="reference")
    del ref.captures["blk.0.attn_norm"]
    w = widgets.stage_stepper(make_run(), ref)
    w.go("blk.0.attn_norm")
    assert "not in the reference" in w.title.value and "blk.0.attn_norm" in w.body.value
    w.step(+1)
    assert "(ok)" in w.title.value


def test_variant_switcher_on_a_tiny_model_moves_the_first_divergence_to_rope(tiny_model):
    """The real wiring of the walkthrough: the callback switches a live lab and re-runs it."""
    lab = labkit.open(tiny_model("gemma3", "Q8_0"))
    ids = [1, 5, 9, 7, 3, 2, 11, 4, 8]
    ref = lab.reference(ids)
    calls = []

    def rerun(selection):
        calls.append(dict(selection))
        for family, name in selection.items():
            lab.use(family, name)
        return lab.run(ids)

    lab.run(ids)
    fams = {f: v for f, v in lab.variants().items() if f in ("rope", "lm_head")}
    w = widgets.variant_switcher(fams, rerun, ref)
    bad = w.select({"rope": "normal_pairs"})
    assert calls[-1] == {"rope": "normal_pairs", "lm_head": "default"}
    assert w.last_comparison.first_divergence == "blk.0.q_rope"
    assert bad.timings["recomputed_from"] == "blk.0.q_rope" and "recomputed from <code>blk.0.q_rope</code>" in (
        w.status.value
    )
    good = w.select({})
    assert w.last_comparison.first_divergence is None and good.variants == {}
    html = good._repr_html_()
    assert lab.piece(ids[1]).replace("<", "&lt;").replace(">", "&gt;") in html


def test_debug_run_repr_names_the_unwritten_logits(tiny_model):
    path = tiny_model("llama", "Q8_0")
    lab = labkit.open(path, variants={"lm_head": "skip_last_window"}, debug=True, window_bytes=4096)
    run = lab.run([1, 5, 9, 7])
    n = run.unwritten["logits"]
    assert n > 0 and sum(v for s, v in run.unwritten.items() if s != "logits") == 0
    h = run._repr_html_()
    assert "first: <code>logits</code>" in h and str(n) in h and f">{n}</td>" in h
    assert run.unwritten_count(run["logits"]) == n  # the poison scan agrees with the pass's own count
    s = array_summary(run, "logits")
    assert s.stats.unwritten == n and "unwritten=" + str(n) in s.html


def test_viz_imports_nothing_upstream_of_captures():
    """Data flows file → model → GPU executor → captures → compare and viz: viz modules must not
    import the lab, the GPU package or the model package."""
    banned = ("labkit.lab", "labkit.gpu", "labkit.model", "labkit.cli", "labkit.casebook")
    for path in sorted((ROOT / "labkit" / "viz").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [n for n in names if n.startswith(banned)]
            assert not bad, f"{path.name} imports {bad}"
