"""How each engine is measured: the GPU path, the float64 reference, llama.cpp.

The same prompts (real text, cut to each length) and the same medians for all three, so their
ratios mean something. A length an engine cannot run (a 2048-token Gemma pass has no room for
[T, 262144] logits in one buffer) is recorded with its typed error instead of a time.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import numpy as np

from labkit.bench.measure import measure, median_time, peak_rss_mb, prompt_of
from labkit.bench.report import BatchFigures, EngineFigures, LengthFigures, OpFamilyTime
from labkit.gpu.dispatch import run, wait_idle
from labkit.lab import Lab
from labkit.lab import open as open_lab
from labkit.ops import OPS


def bench_gpu(lab: Lab, lengths, repeats: int, decode_tokens: int, say) -> EngineFigures:
    say("gpu weight upload")
    t0 = time.perf_counter()
    lab.executor.upload_all()
    load = time.perf_counter() - t0
    figures = [gpu_length(lab, n, repeats, say) for n in lengths]
    say(f"gpu decode, {decode_tokens} greedy tokens")
    prompt = prompt_of(lab, 8)
    lab.generate(prompt, max_new_tokens=4)
    runs = [lab.generate(prompt, max_new_tokens=decode_tokens).timings for _ in range(repeats)]
    rate = float(np.median([t["decode_tok_s"] for t in runs]))
    host = [t["host_ms_per_step"] for t in runs if "host_ms_per_step" in t]
    calls = [t["dispatches_per_step"] for t in runs if "dispatches_per_step" in t]
    ahead = [t["recorded_ahead"] for t in runs if "recorded_ahead" in t]
    rerun = rerun_after_switch(lab, prompt_of(lab, min(lengths)), repeats, say)
    host_ms = float(np.median(host)) if host else None
    calls_ = float(np.median(calls)) if calls else None
    ahead_ = float(np.mean(ahead)) if ahead else None
    return EngineFigures("gpu", load, figures, rate, rerun, peak_rss_mb(), host_ms, calls_, ahead_)


def bench_batch(lab: Lab, n: int, repeats: int, decode_tokens: int, say) -> BatchFigures:
    """A decode step of n sequences (different prompts and lengths) against one sequence's: through
    `generate` (its compiled step) and through the batched path with one sequence."""
    say(f"gpu decode, a batch of {n}")
    base = prompt_of(lab, 8)
    prompts = [base[: max(1, len(base) - k)] for k in range(n)]
    steps = max(decode_tokens // 4, 4)

    def step_s(batch: list) -> tuple[float, float]:
        t = [lab.generate_batch(batch, max_new_tokens=steps).timings for _ in range(repeats)]
        return float(np.median([x["decode_s_per_step"] for x in t])), float(np.median([x["dispatches"] for x in t]))

    lab.generate_batch(prompts, max_new_tokens=2)  # warm: pipelines and plan caches
    many, calls = step_s(prompts)
    one, _ = step_s(prompts[:1])
    gens = [lab.generate(base, max_new_tokens=steps).timings for _ in range(repeats)]
    compiled = float(np.median([1.0 / x["decode_tok_s"] for x in gens]))
    return BatchFigures(n, many, compiled, one, calls)


def gpu_length(lab: Lab, n: int, repeats: int, say) -> LengthFigures:
    """The three prefill figures of one prompt length on the GPU path."""
    ids = prompt_of(lab, n)

    def run(**kw):
        lab.forget_last_pass()  # a fresh pass each time, not a re-run of the last one
        return lab.run(ids, timestamps=False, **kw)

    f = LengthFigures(n)
    f.logits_all_s, why1 = measure(lambda: run(names=["logits"]), repeats, f"gpu T={n} logits everywhere", say)
    f.all_stages_s, why2 = measure(run, repeats, f"gpu T={n} every stage captured", say)
    f.last_only_s, _ = measure(lambda: run(names=["output_norm"]), repeats, f"gpu T={n} output_norm only", say)
    f.note = "; ".join(dict.fromkeys(w for w in (why1, why2) if w))
    return f


def rerun_after_switch(lab: Lab, ids: list[int], repeats: int, say) -> float:
    """A re-run of the same prompt after switching the rope variant at the middle layer: only the
    stages from that layer's rope on are recomputed."""
    say("gpu re-run after a variant switch at the middle layer")
    key = f"blk.{lab.config.n_layers // 2}.rope"
    times = []
    lab.run(ids, timestamps=False)
    for i in range(repeats + 1):
        lab.use(key, "normal_pairs" if i % 2 == 0 else "default")
        t0 = time.perf_counter()
        lab.run(ids, timestamps=False)
        times.append(time.perf_counter() - t0)
    lab.use(key, "default")
    return float(np.median(times[1:]))


def op_family_times(lab: Lab, ids: list[int], decode: bool = False) -> list[OpFamilyTime]:
    """GPU ms per kernel family over one pass of `ids` (every stage captured), from timestamps; with
    `decode`, over one decode step after `ids` (the matmuls' GB/s then mean what they say: each
    weight is read once for one token)."""
    lab.forget_last_pass()
    lab.run(ids)  # warm
    lab.forget_last_pass()
    if decode:
        from labkit.gpu.pass_request import PassRequest

        ex = lab.executor
        state = ex.new_state(len(ids) + 1)
        ex.run_pass(PassRequest(ids, names=(), last_logits_only=True), state)
        plans = ex.run_pass(PassRequest(ids[-1:], names=("logits",), last_logits_only=True), state).plans
        return _per_family(lab, dict.fromkeys((p.stage.name for p in plans), 0.0), 1, decode_family_ms(lab, plans))
    stage_ms, T = lab.run(ids, timestamps=True).timings.get("stage_ms", {}), len(ids)
    return _per_family(lab, stage_ms, T)


def decode_family_ms(lab: Lab, plans: list, repeats: int = 5) -> dict[str, float]:
    """Wall ms per kernel family of one decode step: that family's dispatches alone, submitted and
    waited for (median of `repeats`). Not timestamps: lavapipe writes a pass's end timestamp before
    a small dispatch has finished, so a step's per-stage timestamps charge one stage's time to the
    next one (a 2048 x 640 Q5_0 matvec read at "100 GB/s")."""
    ex = lab.executor
    by_family = defaultdict(list)
    for p in plans:
        by_family[ex.family(p.stage)] += p.dispatches
    out = {}
    for fam, dispatches in by_family.items():
        if dispatches:
            out[fam] = 1e3 * median_time(lambda d=dispatches: run_and_wait(ex, d), repeats)
    return out


def run_and_wait(ex, dispatches: list) -> None:
    run(ex.gpu, dispatches)
    wait_idle(ex.gpu)


def _per_family(lab: Lab, stage_ms: dict[str, float], T: int, family_ms: dict | None = None) -> list[OpFamilyTime]:
    """Stage times summed per kernel family (or the family's time measured whole, `family_ms`), with
    the matmuls' GFLOP/s and GB/s of GGUF bytes."""
    ms, calls, flops, nbytes = defaultdict(float), defaultdict(int), defaultdict(float), defaultdict(float)
    ex = lab.executor
    for st in lab.graph:
        if st.name not in stage_ms:
            continue
        fam = ex.family(st)
        ms[fam] += stage_ms[st.name]
        calls[fam] += 1
        if OPS[st.op].weight == "matrix":
            t = lab.gguf.tensors[st.weight]
            rows = t.n_rows if not st.weight_rows else st.weight_rows[1] - st.weight_rows[0]
            flops[fam] += 2.0 * T * t.n_cols * rows
            nbytes[fam] += t.nbytes * rows / t.n_rows
    if family_ms is not None:
        ms = {fam: family_ms.get(fam, 0.0) for fam in ms}
    out = []
    for fam in sorted(ms, key=ms.get, reverse=True):
        s = ms[fam] / 1e3
        gf = flops[fam] / s / 1e9 if flops[fam] and s else None
        gb = nbytes[fam] / s / 1e9 if nbytes[fam] and s else None
        out.append(OpFamilyTime(fam, ms[fam], calls[fam], gf, gb))
    return out


def bench_reference(model: str, lengths, repeats: int, decode_tokens: int, say, memory=None) -> EngineFigures:
    say("reference load (dequantizing the weights that fit the budget)")
    t0 = time.perf_counter()
    lab = open_lab(model, memory=memory)
    lab.reference(prompt_of(lab, 4), names=["logits"])  # dequantizes and caches the float64 weights
    load = time.perf_counter() - t0
    figures = []
    for n in lengths:
        ids = prompt_of(lab, n)
        f = LengthFigures(n)
        logits_only = lambda ids=ids: lab.reference(ids, names=["logits"])  # noqa: E731
        f.logits_all_s, f.note = measure(logits_only, repeats, f"reference T={n}", say)
        if f.logits_all_s is not None:
            every = lambda ids=ids: lab.reference(ids)  # noqa: E731
            f.all_stages_s, _ = measure(every, repeats, f"reference T={n} every stage", say)
        figures.append(f)
    say(f"reference decode, {decode_tokens} greedy tokens")
    prompt = prompt_of(lab, 8)
    rates = [lab.generate_reference(prompt, max_new_tokens=decode_tokens).timings["decode_tok_s"] for _ in range(2)]
    return EngineFigures("reference", load, figures, float(np.median(rates)), None, peak_rss_mb())


def bench_llamacpp(
    lab: Lab, lengths, repeats: int, decode_tokens: int, say, threads: int | None = None
) -> EngineFigures | None:
    """llama.cpp on the same file and token ids (extra "oracle"); None when it is not installed.
    Prefill with logits at every position (logits_all), as the GPU figure is measured. It runs on
    every core this process may use (2 on the CI machine, 16 beside a lent GPU)."""
    threads = threads or len(os.sched_getaffinity(0))
    try:
        import llama_cpp
    except ImportError:
        return None
    t0 = time.perf_counter()
    n_ctx = max(max(lengths), 64) + decode_tokens + 8
    try:
        llm = llama_cpp.Llama(model_path=str(lab.path), n_ctx=n_ctx, n_threads=threads, n_batch=512,
                              logits_all=True, verbose=False)  # fmt: skip
    except ValueError as e:  # a file llama.cpp will not load: the report goes on without it
        say(f"llama.cpp cannot load {lab.path.name}: {e}")
        return None
    load = time.perf_counter() - t0
    figures = []
    for n in lengths:
        ids = prompt_of(lab, n)

        def prefill(ids=ids):
            llm.reset()
            llm.eval(ids)

        say(f"llama.cpp T={n}")
        figures.append(LengthFigures(n, logits_all_s=median_time(prefill, repeats)))
    say(f"llama.cpp decode, {decode_tokens} greedy tokens")
    prompt = prompt_of(lab, 8)
    rates = []
    for _ in range(repeats):
        llm.reset()
        llm.eval(prompt)
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(decode_tokens - 1):
            llm.eval([nxt])
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        rates.append((decode_tokens - 1) / (time.perf_counter() - t0))
    llm.close()
    return EngineFigures("llamacpp", load, figures, float(np.median(rates)), None, None)


def bench_llamacpp_vulkan(lab: Lab, lengths, repeats: int, decode_tokens: int, say) -> EngineFigures | None:
    """llama.cpp's Vulkan backend on the adapter labkit uses, every layer offloaded, in its own process
    (labkit.bench.vulkan_peer); None, said, when it is not installed (make peer-vulkan) or fails."""
    from labkit.bench.vulkan_peer import run_peer

    say("llama.cpp's Vulkan backend (its own process)")
    got = run_peer(lab.path, list(lengths), repeats, decode_tokens)
    if "error" in got:
        say(got["error"])
        return None
    figures = [LengthFigures(n, last_only_s=got["prefill_s"][str(n)]) for n in lengths]
    detail = f"{got['device']}, {got['llamacpp']}, from {got['wheel']}"
    return EngineFigures("llamacpp-vulkan", got["load_s"], figures, got["decode_tok_s"], detail=detail)
