"""Write notebooks/case_<name>.ipynb, one per post-mortem case (run from the repository root).

    .venv/bin/python scripts/make_case_notebooks.py

Each notebook tells the post-mortem's story and its misleading clues, reproduces the fault on a
live Lab, looks at the symptoms with labkit.viz, localizes the first divergent stage with
labkit.compare, applies the fix, re-checks, and ends with the whole case (`run_case`). The story,
lesson and notes come from the case definitions in labkit/cases, so they stay in one place.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.cases import get_case  # noqa: E402

SETUP = """\
import warnings

warnings.filterwarnings("ignore", message="Glyph")  # token pieces in scripts the plot font lacks
try:
    import labkit
except ImportError:  # opened from notebooks/ without labkit installed
    import sys

    sys.path.insert(0, "..")
    import labkit
import matplotlib.pyplot as plt
import numpy as np

from labkit.cases import get_case, run_case
from labkit.viz import case_figures, figures

%matplotlib inline"""


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(src: str):
    return new_code_cell(src.strip("\n"))


def header(name: str, clues: str) -> list:
    c = get_case(name)
    faults = ", ".join(f"`{k}={v}`" for k, v in c.fault.items())
    for extra in c.extra_faults:
        faults += " (and " + ", ".join(f"`{k}={v}`" for k, v in extra.items()) + ")"
    notes = "\n".join(f"- {n}" for n in c.notes)
    return [
        md(f"""
# Case `{c.name}`: {c.title}

From post-mortem {c.postmortem}. Model `{c.model}`, prompt `{c.prompt!r}`. Fault: {faults}.

## The story
{c.story}

## The misleading clues
{clues}
"""),
        code(SETUP),
        code(f"""
case = get_case({c.name!r})
lab = case.open_lab()
prompt = case.prompt
lab, case.fault
"""),
    ], (
        md(f"""
## What did not reproduce, and why
{notes}

## Lesson
{c.lesson}
""")
        if notes
        else md(f"## Lesson\n{c.lesson}")
    )


def report_cells(name: str) -> list:
    return [
        md("""
## The whole case, end to end
`run_case` runs the faulty pass, reports every symptom (expected threshold, observed value),
localizes the first divergence against the reference, runs the fixed pass and checks the
post-mortem's checklist. The same report is `labkit case NAME` on the command line.
"""),
        code(f"""
report = run_case({name!r}, lab=lab)
print(report.text())
assert report.passed
"""),
    ]


def q4k_sign() -> list:
    head, tail = header(
        "q4k-sign",
        """
- The FFN down projection of layer 0 had the largest values, so the FFN looked guilty. Here
  `blk.0.ffn_down` is not even Q4_K (it is Q6_K): it explodes because its input is wrong.
- The post-FFN sandwich norm rescaled the explosion back to ordinary sizes, so every stage
  *after* it looked normal.
- Dequantization tests of two tensors had passed: they checked a separate dequantizer, not the
  kernel the matmul really runs.
""",
    )
    layer0 = [
        "embed",
        "blk.0.attn_norm",
        "blk.0.q",
        "blk.0.attn_ctx",
        "blk.0.attn_out",
        "blk.0.post_attn_norm",
        "blk.0.resid_mid",
        "blk.0.ffn_norm",
        "blk.0.ffn_act",
        "blk.0.ffn_down",
        "blk.0.post_ffn_norm",
        "blk.0.resid_out",
    ]
    return head + [
        md("## 1. Reproduce the fault\nSelect the faulty Q4_K kernel on the live lab and run the prompt."),
        code("""
lab.use("matmul_q4_k", "mins_added")
bad = lab.run(prompt)
bad.top(5)
"""),
        code("figures.logit_ranking(bad, k=10);"),
        md("## 2. The symptoms\nStage statistics of layer 0, before and after each sandwich norm:"),
        code("""
for s in ["blk.0.attn_out", "blk.0.post_attn_norm", "blk.0.ffn_down", "blk.0.post_ffn_norm"]:
    print(bad.stats(s))
"""),
        md(
            "Against the reference: the values jump at `attn_out` and `ffn_down`, and each norm brings "
            "them back to the reference's size."
        ),
        code(f"""
ref = lab.reference(prompt)
case_figures.stage_magnitudes({{"faulty": bad, "reference": ref}}, {layer0!r});
"""),
        code("""
fig, axs = plt.subplots(1, 2, figsize=(11, 3))
figures.histogram(bad, "blk.0.ffn_down", pos=None, ax=axs[0])
figures.histogram(bad, "blk.0.post_ffn_norm", pos=None, ax=axs[1]);
"""),
        md(
            "Which tensors are Q4_K? The first Q4_K matmul in stage order is where the pass must first leave "
            "the reference. The one-hot round trip reads that weight through the real GPU kernel."
        ),
        code("""
from labkit.cases.tools import first_tensor_of_type, weight_roundtrip

print({n: t.type_name for n, t in lab.gguf.tensors.items() if n.startswith("blk.0.") and t.type_name != "F32"})
print("first Q4_K matmul:", first_tensor_of_type(lab, "Q4_K"))
print(weight_roundtrip(lab, "blk.0.attn_output.weight").describe())
"""),
        md(
            "## 3. Localize\nEvery stage against the float64 reference; the first failing one is the root "
            "cause's stage."
        ),
        code("""
cmp = labkit.compare(bad, ref)
figures.divergence(cmp)
print("\\n".join(cmp.table(only_failed=True).splitlines()[:6]))
cmp.first_divergence
"""),
        md("## 4. Fix and re-check"),
        code("""
lab.use("matmul_q4_k", "default")
good = lab.run(prompt)
print(good.top(5))
print("matches the reference:", labkit.compare(good, ref).passed)
print(weight_roundtrip(lab, "blk.0.attn_output.weight").describe())
"""),
        *report_cells("q4k-sign"),
        tail,
    ]


def sky_kaw() -> list:
    head, tail = header(
        "sky-kaw",
        """
- **Five values, all positive.** `FINAL_HIDDEN[pos=6]: [183.6, 42.7, 201.1, 63.4, 294.5]` led to a
  "positive bias" theory. The full vector had mixed signs all along.
- **Fixes that changed nothing.** The tier's workgroup count was really wrong, but fixing it left
  the output the same: a change that leaves the numbers identical cannot be the fix.
- **Position 0 vs position 6.** Later positions attend to more keys, which made the attention
  suspect for the wrong reason: the prompt pass was fine, the decode path was not.
""",
    )
    return head + [
        md(
            "## 1. The 5-value readout against the whole vector\nA correct pass. Some 5 consecutive values of "
            "the last position's final hidden state are all positive; the histogram shows the rest."
        ),
        code("""
from labkit.cases import sky_kaw
from labkit.cases.tools import sign_readout

good = lab.run(prompt)
v = good["blk.17.resid_out"][-1]
sr = sign_readout(v, 5)
w = sr.illusion_at
print(f"values {w}..{w + 4}:", np.round(v[w:w + 5], 1), "-> all positive")
print(f"whole vector: {sr.negative_frac:.1%} of {v.size} negative")
ax = figures.histogram(good, "blk.17.resid_out", pos=-1, bins=np.linspace(-2500, 2500, 101))  # the bulk
for x in v[w:w + 5]:
    ax.axvline(x, color="#c44e52", lw=1)  # the 5 values read on their own
"""),
        md(
            "## 2. Per-position layer trajectories\nmin/max of `resid_out` per layer at position 0 and at the "
            "last position: mixed signs at every layer, a few huge positive values (massive activations)."
        ),
        code("figures.layer_trajectory(good, lab.config.n_layers, positions=(0, -1));"),
        md("## 3. Reproduce the fault\nDecode runs the prefill kernel. The prompt pass does not change at all:"),
        code("""
lab.use("attn_scores", "decode_uses_prefill")
bad_prompt = lab.run(prompt)
print("prompt pass identical:", labkit.compare(bad_prompt, good).passed)
print("greedy:", repr(lab.generate(prompt, 4).text))
"""),
        md(
            'The sky step reads the prompt\'s prediction through the decode path: "The color of the sky" is '
            'prefilled and " is" decoded on its cache.'
        ),
        code("""
bad = sky_kaw.observe(lab, "faulty", dict(case.fault), None)
step = bad.runs["sky_step"]
print(step.top(5))
print("' blue' rank:", int(np.sum(step.logits() > step.logits()[3730])))
figures.attention_map(step, layer=0, head=0);
"""),
        md(
            "## 4. Localize on a decode step\nThe reference runs the same prefix and the same decode step with "
            "its KV cache."
        ),
        code("""
ref = sky_kaw.reference(lab)
cmp = labkit.compare(step, ref.runs["sky_step"])
figures.divergence(cmp)
cmp.first_divergence
"""),
        md(
            '## 5. Tracked tokens through a logit lens\n" blue" and the garbage winner (the faulty run\'s first '
            "wrong greedy token), each layer's hidden state read through the final norm and the embedding."
        ),
        code("""
lab.use("attn_scores", "default")
fixed = sky_kaw.observe(lab, "fixed", dict(case.fix), None)
at, garbage = sky_kaw.garbage_winner(bad, ref)
print("garbage winner:", garbage, repr(lab.piece(garbage)), "at greedy step", at)
case_figures.lens_ranks({"faulty": bad["lens"], "fixed": fixed["lens"]}, [3730, garbage]);
"""),
        code("""
for label, ev in (("faulty", bad), ("fixed", fixed)):
    for t in (3730, garbage):
        print(f"{label:6} {lab.piece(t)!r:8} rank by layer:", ev["lens"].ranks(t))
"""),
        md(
            '## 6. The tier-dispatch "fix"\nThe tiled attention tier dispatched with the streaming count '
            "(T x heads workgroups instead of ceil(T/8) x heads) and with the right count: the extra workgroups "
            "find no head and return, so the logits are bit-identical. A real bug, and not this one."
        ),
        code("""
for label, ev in (("faulty", bad), ("fixed", fixed)):
    w, r = ev["tier_logits"]["streaming_count"], ev["tier_logits"]["default"]
    diff = float(np.max(np.abs(w - r)))
    print(label, "max |wrong count - right count|", diff, "' blue' rank", int(np.sum(r > r[3730])))
"""),
        *report_cells("sky-kaw"),
        tail,
    ]


def lm_head_unwritten() -> list:
    head, tail = header(
        "lm-head-unwritten",
        """
- **Vocab size mismatch?** The bug report blamed 151 643 vs 151 936 rows; the tensor had all of
  them. The weights at the bad rows were fine too.
- **Garbage only at a few positions.** Most logits looked right, so the lm_head "worked".
- Here: **WebGPU zero-fills new buffers**, so without debug poison the unwritten logits read 0.0,
  lose the argmax, and the bug hides completely.
""",
    )
    return head + [
        md("## 1. The head in row windows\nSmolLM2's tied head (49 152 rows) is opened in 4 MiB windows:"),
        code("""
[(w.first_row, w.n_rows) for w in lab.executor.weight("token_embd.weight").windows]
"""),
        md("## 2. Reproduce the fault\nThe last window is never dispatched. A normal pass looks fine:"),
        code("""
lab.use("lm_head", "skip_last_window")
plain = lab.run(prompt, names=["logits"])
print(plain.top(3))
print("logits exactly 0.0 at the last position:", int(np.sum(plain["logits"][-1] == 0.0)))
"""),
        md(
            "Debug mode poisons every output before the pass (a NaN payload, like uninitialized memory) and "
            "counts what is still poison afterwards:"
        ),
        code("""
run = lab.run(prompt, debug=True)
print({k: v for k, v in run.unwritten.items() if v})
z = run["logits"][-1]
rows = np.flatnonzero(np.isnan(z))
print("unwritten rows", rows.min(), "-", rows.max(), f"({rows.size})")
top = int(np.argmax(z))
print("np.argmax:", top, repr(lab.piece(top)))
case_figures.logit_rows(run, bad_rows=[(int(rows.min()), int(rows.max()))]);
"""),
        md(
            "## 3. The same token, again and again\nThe post-mortem's loop: argmax over the raw logits buffer, one "
            "decode pass per token."
        ),
        code("""
from labkit.cases import lm_head_unwritten

ev = lm_head_unwritten.observe(lab, "faulty", dict(case.fault), None)
ev["text"], ev["steps"][:2]
"""),
        md("## 4. Localize"),
        code("""
ref = lab.reference(prompt)
with np.errstate(invalid="ignore"):
    cmp = labkit.compare(run, ref)
print(cmp.first_divergence, cmp.row("logits"))
"""),
        md("## 5. Fix and re-check"),
        code("""
lab.use("lm_head", "default")
fixed = lab.run(prompt, debug=True)
print("unwritten:", sum(fixed.unwritten.values()), "argmax:", repr(lab.piece(int(np.argmax(fixed["logits"][-1])))))
print("matches the reference:", labkit.compare(fixed, ref).passed)
"""),
        *report_cells("lm-head-unwritten"),
        tail,
    ]


def norm_cascade() -> list:
    head, tail = header(
        "norm-cascade",
        """
- **"Small RMSNorm x large weights = huge Q/K/V."** The chain does not multiply out: tiny norm
  output times normal weights is tiny. The lab shows it below (one fault at a time).
- **"scores post-mask: mean=-inf std=NaN".** That is what a masked score matrix always gives:
  the causal mask's -inf entries. A correct pass prints the same.
- **"[norm] post-ffn: inf".** An f32 L2 norm: finite values (about 7e19) whose squares overflow.
- **Hypothesis C (eps outside the sqrt).** Measurably harmless.
""",
    )
    chain = [
        "blk.0.attn_norm",
        "blk.0.q",
        "blk.0.k",
        "blk.0.v",
        "blk.0.attn_ctx",
        "blk.0.attn_out",
        "blk.0.resid_mid",
        "blk.0.ffn_norm",
        "blk.0.ffn_down",
        "blk.0.resid_out",
        "blk.1.attn_norm",
        "output_norm",
        "logits",
    ]
    return head + [
        md(
            "## 1. Hypothesis B as a variant\nThe case registers a Q4_1 kernel whose block-scale clamp has its "
            "bounds swapped, so every scale reads 1e6:"
        ),
        code("""
[line.strip() for line in labkit.kernel_source("matmul_q4_1", "scale_clamp_swapped").splitlines() if "1e6" in line]
"""),
        md("## 2. One fault at a time\nWhat each candidate does on its own, and together:"),
        code("""
import warnings

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the NaN row below
ref = lab.reference(prompt)
trials = {
    "norm scale only": {"rmsnorm": "scale_clamp"},
    "eps outside only": {"rmsnorm": "eps_outside"},
    "clamp only": {"matmul_q4_1": "scale_clamp_swapped"},
    "norm + clamp (the case)": case.fault,
    "norm + clamp + no max-sub": {**case.fault, "softmax": "no_max_sub"},
}
for label, sel in trials.items():
    for fam in ("rmsnorm", "matmul_q4_1", "softmax"):
        lab.use(fam, sel.get(fam, "default"))
    r = lab.run(prompt)
    z = r["logits"][-1]
    print(f"{label:26} norm rms {r.stats('blk.0.attn_norm').rms:9.2e}  max|q| {np.abs(r['blk.0.q']).max():9.2e}  "
          f"probs NaN {int(np.isnan(r['blk.0.attn_probs']).sum()):4d}  logits std {np.nanstd(z):9.2e}  "
          f"first divergence {labkit.compare(r, ref).first_divergence}")
for fam in ("rmsnorm", "matmul_q4_1", "softmax"):
    lab.use(fam, "default")
"""),
        md("## 3. Reproduce the fault"),
        code("""
for fam, v in case.fault.items():
    lab.use(fam, v)
bad = lab.run(prompt)
chain = ["blk.0.attn_norm", "blk.0.q", "blk.0.attn_scores", "blk.0.attn_probs", "blk.0.resid_out", "blk.1.attn_norm"]
for s in chain + ["logits"]:
    print(bad.stats(s))
"""),
        code(f"""
case_figures.stage_magnitudes({{"faulty": bad, "reference": ref}}, {chain!r});
"""),
        code("""
fig, axs = plt.subplots(1, 2, figsize=(9, 3.5))
figures.attention_map(bad, 0, head=0, ax=axs[0])
figures.attention_map(ref, 0, head=0, ax=axs[1]);
"""),
        md(
            'The post-mortem\'s "inf" was an f32 norm print; its "NaN after the mask" was the std of a matrix '
            "holding -inf (in the correct reference, too):"
        ),
        code("""
x = bad["blk.0.resid_out"].astype(np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    print("f32 L2 per position:", np.sqrt(np.sum(x * x, axis=-1, dtype=np.float32)))
    print("reference scores: mean", np.mean(ref["blk.0.attn_scores"]), "std", np.std(ref["blk.0.attn_scores"]))
"""),
        md("## 4. Localize"),
        code("""
cmp = labkit.compare(bad, ref)
figures.divergence(cmp)
cmp.first_divergence
"""),
        md("## 5. Fix and re-check"),
        code("""
for fam, v in case.fix.items():
    lab.use(fam, v)
good = lab.run(prompt)
print(good.stats("blk.0.attn_norm"), good.stats("blk.0.q"), sep="\\n")
print("matches the reference:", labkit.compare(good, ref).passed)
"""),
        *report_cells("norm-cascade"),
        tail,
    ]


def top_p_order() -> list:
    head, tail = header(
        "top-p-order",
        """
- **Their test ran at top-p 1.0**, where the top-p path is skipped: both bugs were invisible to
  it (shown below with a chi-square test).
- **Varied tokens looked like a working sampler.** Variety says nothing about *which*
  distribution is sampled.
- **The mojibake came from upstream.** The sampler was fixed and the garbage stayed: wrong logits.
""",
    )
    return head + [
        md("## 1. Real logits\nSmolLM2's last-position logits for the prompt; the pass agrees with the reference."),
        code("""
from labkit.cases import top_p_order as tp
from labkit.cases.tools import chi_square
from labkit.sampling import Sampler

run = lab.run(prompt, names=["logits"])
print("pass matches the reference:", labkit.compare(run, lab.reference(prompt, names=["logits"])).passed)
z = run.logits()
run.top(5)
"""),
        md("## 2. Reproduce the fault\nThe same logits through each order, at temperature 1.0 and top-p 0.9:"),
        code("""
exact_ids, exact_p = tp.exact_distribution(z, **tp.SETTINGS)
draws = {}
for v in ("top_p_before_softmax", "norm_top1000", "default"):
    s = Sampler(seed=0, variant=v, **tp.SETTINGS)
    ids, p = s.distribution(z)
    draws[v] = np.array([s.draw((ids, p)) for _ in range(tp.N_DRAWS)])
    cs = chi_square(draws[v], exact_ids, exact_p)
    print(f"{v:22} keeps {len(ids):4d} (exact {len(exact_ids)})  accumulated sum {tp.accumulated(v, z, 1.0).sum():.4f}"
          f"  chi-square p {cs.p:.2e}  distinct {len(set(draws[v].tolist()))}")
"""),
        code("""
fig, axs = plt.subplots(1, 3, figsize=(15, 3.2))
for ax, v in zip(axs, draws):
    case_figures.sampled_vs_exact(draws[v], exact_ids, exact_p, piece=lab.piece, k=15, ax=ax, title=v)
"""),
        md(
            "## 3. The post-mortem's own test settings\nTemperature 0.7, top-p 1.0: every order passes the chi-square "
            "test, so their test could not see either bug."
        ),
        code("""
pm = tp.POSTMORTEM_SETTINGS
ids0, p0 = tp.exact_distribution(z, **pm)
for v in ("top_p_before_softmax", "norm_top1000", "default"):
    s = Sampler(seed=0, variant=v, **pm)
    d = s.distribution(z)
    print(f"{v:22} chi-square p {chi_square(np.array([s.draw(d) for _ in range(tp.N_DRAWS)]), ids0, p0).p:.3f}")
"""),
        md(
            "## 4. Localize\nEvery stage of the pass, logits included, agrees with the reference: the first step that "
            "differs is the sampler, after the `logits` stage."
        ),
        md(
            "## 5. Fix\nThe `default` order (temperature, top-k, softmax over the whole vocabulary, top-p on "
            "probabilities) is the row above with chi-square p well above 1e-3."
        ),
        *report_cells("top-p-order"),
        tail,
    ]


def rope_style() -> list:
    head, tail = header(
        "rope-style",
        """
- **Position 0 is exact.** A rotation by angle 0 does nothing, whatever the pairing: a check of
  the first token, or of any single-token prompt, passes.
- **The output still looks right.** " a", " the", " blue" stay on top; only a later token goes.
""",
    )
    return head + [
        md("## 1. Reproduce the fault"),
        code("""
from labkit.cases import rope_style

lab.use("rope", "normal_pairs")
bad = lab.run(prompt)
print(bad.top(3))
print("greedy:", repr(lab.generate(prompt, 4).text))
"""),
        md("## 2. The symptom: errors that grow with position"),
        code("""
ref = lab.reference(prompt)
case_figures.per_position({
    "blk.0.q_rope": rope_style.per_position(bad, ref, "blk.0.q_rope"),
    "logits": rope_style.per_position(bad, ref, "logits"),
});
"""),
        code("""
fig, axs = plt.subplots(1, 2, figsize=(9, 3.5))
figures.attention_map(bad, 0, head=0, ax=axs[0])
figures.attention_map(ref, 0, head=0, ax=axs[1]);
"""),
        md("## 3. Localize"),
        code("""
cmp = labkit.compare(bad, ref)
figures.divergence(cmp)
cmp.first_divergence
"""),
        md(
            "## 4. Prove it by patching\nStill under the fault, write the reference's roped q and k back on the GPU "
            "after every rope stage (`lab.run(prompt, patch={stage: fn})`) and let the pass continue from them. "
            "If rope is the only thing wrong, every other stage now matches the reference."
        ),
        code("""
patch = {name: (lambda a, stage: ref[stage]) for name in lab.stages if name.endswith(("q_rope", "k_rope"))}
patched = labkit.compare(lab.run(prompt, patch=patch), ref)
print("patched run passes every stage:", patched.passed, "| first divergence:", patched.first_divergence)
"""),
        md("## 5. Fix and re-check"),
        code("""
lab.use("rope", "default")
good = lab.run(prompt)
print("matches the reference:", labkit.compare(good, ref).passed, "| greedy:", repr(lab.generate(prompt, 4).text))
"""),
        *report_cells("rope-style"),
        tail,
    ]


BUILDERS = {
    "q4k-sign": q4k_sign,
    "sky-kaw": sky_kaw,
    "lm-head-unwritten": lm_head_unwritten,
    "norm-cascade": norm_cascade,
    "top-p-order": top_p_order,
    "rope-style": rope_style,
}


def notebook_path(name: str) -> Path:
    return ROOT / "notebooks" / f"case_{name}.ipynb"


def main() -> None:
    for name, build in BUILDERS.items():
        nb = new_notebook(cells=build())
        for i, cell in enumerate(nb.cells):  # stable ids: a re-run changes only what changed
            cell.id = f"{name}-{i:02d}"
        nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
        nb.metadata["language_info"] = {"name": "python"}
        path = notebook_path(name)
        nbformat.write(nb, path)
        print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
