"""Decoding: the one loop that runs a prompt pass and then a pass per new token, on the GPU (its
compiled step, labkit.gpu.compiled_step) or on the float64 reference, and what a generate reports
(the rate, and the host's side of each warm GPU step)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit import progress
from labkit.errors import InvalidArgumentError
from labkit.model.reference import KVCache
from labkit.sampling import GREEDY, Sampler


@dataclass
class Generation:
    """Greedy or sampled continuation: new ids and their text, plus the prompt ids."""

    prompt_ids: list[int]
    ids: list[int]
    text: str
    timings: dict[str, float] = field(default_factory=dict)


def decode_loop(lab: Any, prompt: Any, max_new_tokens: int, pick, step, desc: str = "generate") -> Generation:
    """The one decode loop: `step(ids)` runs a pass and returns the last position's logits,
    `pick(logits)` chooses the next token; stops at EOS or after max_new_tokens. A bar over the
    new tokens (labkit.progress) shows the rate and the latest piece."""
    if max_new_tokens < 0:
        raise InvalidArgumentError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    ids = lab.prompt_ids(prompt, extra=max_new_tokens)
    out: list[int] = []
    with progress.bar(max_new_tokens, desc, unit="tok") as bar:
        t0 = time.perf_counter()
        logits = step(ids)
        t1 = time.perf_counter()
        while len(out) < max_new_tokens:
            out.append(pick(logits))
            bar.set_postfix_str(repr(lab.piece(out[-1])), refresh=False)
            bar.update(1)
            if out[-1] == lab.config.eos_id or len(out) == max_new_tokens:
                break
            logits = step([out[-1]])
        t2 = time.perf_counter()
    n_dec = max(len(out) - 1, 1)
    return Generation(
        ids,
        out,
        lab.detokenize(out),
        {"prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_tok_s": n_dec / max(t2 - t1, 1e-9)},
    )


def generate_reference(lab: Any, prompt: Any, max_new_tokens: int = 8, sampler: Sampler | None = None) -> Generation:
    """KV-cached decode in the float64 reference (slow; for checking the GPU path)."""
    cache, engine = KVCache(), lab.reference_engine

    def step(ids: list[int]) -> np.ndarray:
        return engine.forward(ids, cache, capture=["logits"])["logits"][-1]

    return decode_loop(lab, prompt, max_new_tokens, sampler or GREEDY, step, desc="generate (reference)")


def decode_step(lab: Any, prompt: Any, engine: str) -> Any:
    """`Lab.decode_step`: the prompt's last token as a decode step on `engine`, after a pass of the others."""
    ids = lab.prompt_ids(prompt)
    if engine == "reference":
        cache = KVCache()
        lab.reference_engine.forward(ids[:-1], cache, capture=[])
        caps = lab.reference_engine.forward(ids[-1:], cache)
    elif engine == "gpu":
        from labkit.gpu.pass_request import PassRequest

        ex = lab.executor
        state = ex.new_state(len(ids))
        ex.run_pass(PassRequest(ids[:-1], names=(), last_logits_only=True), state)
        caps = ex.run_pass(PassRequest(ids[-1:]), state).captures
    elif engine == "llamacpp":  # llama.cpp's own decode step, on the caches its prompt pass left
        from labkit.oracle.llamacpp_run import run_llamacpp

        caps = run_llamacpp(lab.path, lab.config, lab.graph, ids, past=len(ids) - 1)
    else:
        raise InvalidArgumentError(f"decode_step engine {engine!r}: use 'gpu', 'reference' or 'llamacpp'")
    chosen = dict(lab.selected) if engine == "gpu" else {}
    return lab._make_run(engine, ids[-1:], caps, {}, n_past=len(ids) - 1, variants=chosen)


def generate_gpu(lab: Any, prompt: Any, max_new_tokens: int = 16, sampler: Sampler | None = None) -> Generation:
    """KV-cached decode on the GPU: one prefill pass, then one pass per new token, each a warm run of
    the sequence's compiled step."""
    from labkit.gpu.pass_request import PassRequest
    from labkit.gpu.reuse import Reuse
    from labkit.gpu.sampling import GpuSampler

    ex = lab.executor
    state = lab._generate_state(len(lab.prompt_ids(prompt, extra=max(max_new_tokens, 0))) + max(max_new_tokens, 0))
    ex.upload_all()
    steps: list[dict] = []  # each decode step's timings

    sampler = sampler or GREEDY
    # a greedy decode step reads back its token, 4 bytes, where the adapter gains by it (GpuExecutor.pick_on_device)
    on_device = sampler.greedy and sampler.variant == "default" and ex.picks_on_device

    def step(ids: list[int]) -> np.ndarray | int:
        # a step runs the state's compiled step (labkit.gpu.compiled_step); the prefill reuses objects
        decode = len(ids) == 1
        reuse = Reuse.steps() if decode else Reuse.objects("prefill")
        names, pick = ((), "greedy") if decode and on_device else (("logits",), None)
        res = ex.run_pass(PassRequest(ids, names=names, last_logits_only=True, reuse=reuse, pick=pick), state)
        if decode:
            steps.append(res.timings)
        return int(res.captures["next_token"][-1, 0]) if pick else res.captures["logits"][-1]

    host = GpuSampler(ex, sampler)
    gen = decode_loop(lab, prompt, max_new_tokens, lambda got: got if isinstance(got, int) else host(got), step)
    gen.timings.update(step_host_figures(steps))
    return gen


def step_host_figures(steps: list[dict]) -> dict[str, float]:
    """The host's side of decode: the median of each warm step's time from its start to its submit, of
    the bytes it read back (4, a greedy step's token picked on the device) and of its dispatch count (the
    first step, which plans what later ones keep, left out), and the share of warm steps whose encoder the
    step before recorded while the device ran."""
    warm = steps[1:] or steps
    if not warm:
        return {}
    return {"host_ms_per_step": 1e3 * float(np.median([t["host_s"] for t in warm])),
            "dispatches_per_step": float(np.median([t["dispatches"] for t in warm])),
            "readback_bytes_per_step": float(np.median([t.get("readback_bytes", 0) for t in warm])),
            "recorded_ahead": float(np.mean([t.get("recorded_ahead", 0.0) for t in warm]))}  # fmt: skip
