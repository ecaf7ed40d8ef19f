"""Measurements the cases share: a logit lens, GPU weight read-back, sign windows, chi-square,
the reference's greedy continuation.

Pure computation on captures and weights (no figures: labkit.viz draws what these return).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field, replace

import numpy as np

from labkit.captures import Run
from labkit.casebook.base import Evidence
from labkit.lens import LogitLens

# ----- logit lens ---------------------------------------------------------------------------


def logit_lens(lab, run: Run, pos: int = -1, kind: str = "resid_out") -> LogitLens:
    """The logit lens (labkit.lens) of a run at one position, through this lab's final norm and
    unembedding (a run built by a case, not by the lab, gets the lab's)."""
    if run.unembed is None:
        run = replace(run, unembed=lab.reference_engine.unembed)
    return run.logit_lens(kind, positions=pos)


def oracle_or_none(lab, prompt) -> Run | None:
    """llama.cpp's own tensors for `prompt`, or None where llama-cpp-python is not installed (a case's
    checks against llama.cpp are then left out, the others still run)."""
    from labkit.errors import OracleUnavailableError

    try:
        return lab.oracle(prompt)
    except OracleUnavailableError:
        return None


def register_reader_fault(family: str, name: str, old: str, new: str, doc: str) -> None:
    """Register (once) a faulty matmul variant of `family` whose raw-bytes kernel has its block reader's
    `old` text replaced by `new`: a case's own hypothesis about a reader (its scale clamped, ...)."""
    from labkit.errors import LabkitError, UnknownVariantError
    from labkit.gpu.shader import register_variant
    from labkit.ops.registry import get_kernel, kernel_source

    try:
        get_kernel(family, name)
        return
    except UnknownVariantError:
        pass
    src = kernel_source(family, "row")  # the raw-bytes kernel: its block reader is in its source
    if src.count(old) != 1:
        raise LabkitError(f"{family}'s block reader changed: update the case that registers {name}")
    register_variant(family, name, src.replace(old, new), doc=doc, faulty=True)


# ----- weights read back from the GPU --------------------------------------------------------


def gpu_weight_columns(lab, tensor: str, cols: int = 256) -> np.ndarray:
    """Columns [0, cols) of a weight as the GPU's matmul dequantizes it, for every row.

    The current matmul variant of the tensor's format multiplies one-hot activations
    (token t = unit vector e_t), so output t is column t of W: a round trip through the
    real kernel, not a separate dequantizer."""
    from labkit.gpu.dispatch import run as run_dispatches
    from labkit.gpu.executor import STORAGE, Region

    ex = lab.executor
    w = ex.weight(tensor)
    K, N = w.n_cols, w.n_rows
    cols = min(cols, K)
    x = np.zeros((cols, K), dtype=np.float32)
    x[np.arange(cols), np.arange(cols)] = 1.0
    xb = ex.device.create_buffer_with_data(data=x.tobytes(), usage=STORAGE)
    yb = ex.buffer(cols * N, "roundtrip.y", ex.gpu.fresh)
    stage = next(s for s in lab.graph if s.op == "matmul" and s.weight == tensor and not s.weight_rows)
    run_dispatches(ex.gpu, ex.stage_matmul(stage, Region(xb, 0, (cols, K)), Region(yb, 0, (cols, N))), "roundtrip")
    y = np.frombuffer(ex.device.queue.read_buffer(yb, 0, 4 * cols * N), dtype=np.float32)
    return y.reshape(cols, N).T.copy()


def cpu_weight_columns(lab, tensor: str, cols: int = 256) -> np.ndarray:
    """The same columns from labkit's numpy dequantizer (ggml's dequantize_row_*)."""
    from labkit.model.dequant import dequantize_rows

    t = lab.gguf.tensors[tensor]
    rows = dequantize_rows(lab.gguf.raw(tensor), t.ggml_type, t.n_cols, np.arange(t.n_rows))
    return np.asarray(rows[:, : min(cols, t.n_cols)], dtype=np.float32)


@dataclass
class RoundTrip:
    tensor: str
    type_name: str
    cols: int
    neg_frac_gpu: float
    neg_frac_cpu: float
    max_abs_err: float
    scale: float  # max |w| of the CPU values, for a relative reading of the error

    @property
    def preserves_negatives(self) -> bool:
        return self.neg_frac_gpu > 0.25 * self.neg_frac_cpu and self.max_abs_err <= 1e-5 * max(self.scale, 1e-30)

    def describe(self) -> str:
        return (
            f"{self.tensor} ({self.type_name}) first {self.cols} columns on the GPU: {100 * self.neg_frac_gpu:.1f}% "
            f"negative (numpy dequant: {100 * self.neg_frac_cpu:.1f}%), max |gpu-numpy| {self.max_abs_err:.3g}"
        )


def weight_roundtrip(lab, tensor: str, cols: int = 256) -> RoundTrip:
    gpu = gpu_weight_columns(lab, tensor, cols)
    cpu = cpu_weight_columns(lab, tensor, cols)
    return RoundTrip(
        tensor,
        lab.gguf.tensors[tensor].type_name,
        gpu.shape[1],
        float(np.mean(gpu < 0)),
        float(np.mean(cpu < 0)),
        float(np.max(np.abs(gpu - cpu))),
        float(np.max(np.abs(cpu))),
    )


def first_tensor_of_type(lab, type_name: str) -> tuple[str, str] | None:
    """(stage, weight) of the first matmul in stage order whose weight has this ggml type."""
    for st in lab.graph:
        if st.op == "matmul" and lab.gguf.tensors[st.weight].type_name == type_name:
            return st.name, st.weight
    return None


# ----- signs and windows ---------------------------------------------------------------------


@dataclass
class SignReadout:
    """Post-mortem 000's 5-value readout against the whole vector."""

    n: int
    negative_frac: float
    first_values: list[float]
    window: int
    positive_windows: list[int] = field(default_factory=list)  # starts of all-positive windows

    @property
    def illusion_at(self) -> int | None:
        return self.positive_windows[0] if self.positive_windows else None


def sign_readout(v: np.ndarray, window: int = 5) -> SignReadout:
    v = np.asarray(v, dtype=np.float64).ravel()
    pos = v > 0
    c = np.concatenate([[0], np.cumsum(pos)])
    starts = [int(i) for i in np.flatnonzero(c[window:] - c[:-window] == window)]
    return SignReadout(v.size, float(np.mean(v < 0)), [float(x) for x in v[:window]], window, starts)


# ----- the reference's greedy continuation ----------------------------------------------------


@dataclass(kw_only=True)
class GreedyReference(Evidence):
    """The float64 reference's prompt pass and its greedy continuation (KV-cached decode)."""

    prompt: Run  # every stage of the prompt pass
    greedy: list[int]  # the greedy token ids after the prompt
    text: str  # the same tokens as text


def greedy_reference(lab, prompt: str, n_new: int) -> GreedyReference:
    """The reference side of a case that compares a prompt pass and `n_new` greedy tokens."""
    from labkit.model.reference import KVCache

    ids = lab.prompt_ids(prompt, extra=n_new)
    eng = lab.reference_engine
    cache = KVCache()
    run = Run(lab.name, "reference", ids, lab.stages, eng.forward(ids, cache), piece=lab.piece, explain=lab.explain)
    out = [int(np.argmax(run.logits()))]
    while len(out) < n_new:
        out.append(int(np.argmax(eng.forward([out[-1]], cache, capture=["logits"])["logits"][-1])))
    return GreedyReference(side="reference", prompt=run, greedy=out, text=lab.detokenize(out))


# ----- text ---------------------------------------------------------------------------------


def latin_script(piece: str) -> bool:
    """True when every letter of a token is Latin script (digits, spaces, punctuation pass)."""
    for ch in piece:
        if ch.isalpha() and "LATIN" not in unicodedata.name(ch, ""):
            return False
    return True


# ----- chi-square ----------------------------------------------------------------------------


def _gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes' series / continued fraction)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = s = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= x / n
            s += term
            if abs(term) < abs(s) * 1e-15:
                break
        return max(0.0, 1.0 - s * math.exp(-x + a * math.log(x) - lg))
    b = x + 1 - a
    c = 1 / 1e-300
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(-x + a * math.log(x) - lg)


def chi2_sf(stat: float, dof: int) -> float:
    """P(chi-square with `dof` degrees of freedom > stat); scipy's when installed."""
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, dof))
    except ImportError:  # pragma: no cover - scipy is a dev extra
        return _gammaincc(dof / 2.0, stat / 2.0)


@dataclass
class ChiSquare:
    stat: float
    dof: int
    p: float
    bins: int
    samples: int
    outside: int  # draws of tokens the exact distribution does not contain


def chi_square(draws: np.ndarray, ids: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's chi-square of sampled token ids against an exact distribution (ids, probs).

    Tokens are taken in order of decreasing probability; a token with an expected count of at
    least `min_expected` is its own bin, and rarer ones are pooled with their neighbours in rank
    until each pool expects `min_expected` draws. Pooling by rank keeps a lost tail visible (a
    sampler that never draws past rank 1000 leaves the pools beyond it empty). Draws of tokens
    outside the distribution form one more bin that expects (almost) nothing."""
    draws = np.asarray(draws, dtype=np.int64)
    n = draws.size
    order = np.argsort(-np.asarray(probs, dtype=np.float64), kind="stable")
    ids = np.asarray(ids, dtype=np.int64)[order]
    expected = n * np.asarray(probs, dtype=np.float64)[order]
    # bin index of each token, by rank
    bin_of = np.empty(ids.size, dtype=np.int64)
    exp_bins: list[float] = []
    acc, b = 0.0, 0
    for i, e in enumerate(expected):
        bin_of[i] = b
        acc += e
        if acc >= min_expected:
            exp_bins.append(acc)
            acc, b = 0.0, b + 1
    if acc > 0 or not exp_bins:  # a short tail joins the last full bin
        if exp_bins:
            bin_of[bin_of == b] = b - 1
            exp_bins[-1] += acc
        else:
            exp_bins.append(acc)
    index = dict(zip(ids.tolist(), bin_of.tolist()))
    obs = np.zeros(len(exp_bins) + 1)
    for t in draws.tolist():
        obs[index.get(t, len(exp_bins))] += 1
    outside = int(obs[-1])
    exp = np.array(exp_bins + [0.0])
    if outside == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = np.maximum(exp, 1e-12)  # draws where the exact distribution puts no mass: a huge term
    exp = exp * (obs.sum() / exp.sum())
    dof = max(len(obs) - 1, 1)
    try:
        from scipy.stats import chisquare

        res = chisquare(obs, exp)
        stat, p = float(res.statistic), float(res.pvalue)
    except ImportError:  # pragma: no cover - scipy is a dev extra
        stat = float(np.sum((obs - exp) ** 2 / exp))
        p = chi2_sf(stat, dof)
    return ChiSquare(stat, dof, p, len(obs), n, outside)
