"""labkit.load_dumps: another engine's intermediate tensors as a Run on the model's stage names.

source → {name: array} (sources) → stage targets (names) → labkit layout (layout) → the few
conversions an engine's tensor needs to be the same quantity as labkit's stage (below) → Run.
Nothing is dropped silently: names that match no stage are in `run.unmapped`, with why.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from labkit.captures import Run
from labkit.dumps.layout import apply, choose, expect, layout_for
from labkit.dumps.names import PRESETS, NameMap, Target, name_map
from labkit.dumps.sources import Dumped, dumped_ids, read_source
from labkit.errors import InvalidArgumentError, UnknownPresetError, UnmappedDumpsError
from labkit.model.config import ModelConfig
from labkit.model.graph import Stage
from labkit.precision import check_precision, precision_of

# What each preset's engine computes in, when the caller does not say: llama.cpp quantizes
# the activations inside its quantized matmuls to 8 bits. Other presets: the dumps' dtype.
PRESET_PRECISION = {"llamacpp": "int8-activations"}


def load_dumps(
    source: Any,
    model: Any,
    names: str | Mapping[str, str] = "auto",
    layout: str | Mapping[str, str] = "auto",
    tokens: list[int] | None = None,
    prompt: str | None = None,
    engine: str = "dumps",
    precision: str | None = None,
    n_past: int | None = None,
    step: int | None = None,
) -> Run:
    """Another engine's tensors as a Run that `labkit.compare` and every widget take.

    source: a directory of .npy or .pt files (an engine's dump folder: SGLang's, its dumper's or
      TensorRT-LLM's, or their root holding rank 0's), an .npz, a .pt, a .safetensors file, or {name: array}.
    model: an open Lab, or a model name or .gguf path.
    names: "llamacpp", "hf", "transformerlens", "sglang", "trtllm", "auto" (the preset that maps the
      most names), or {their name or regex with {L}: stage name with {L}}.
    layout: "auto", one layout for every tensor ("thd", "bhqk", ...: labkit.dumps.layout), or
      {name or stage glob: layout}.
    tokens / prompt: the ids the engine ran (one of them; neither when the dumps hold them, as
      SGLang's and TensorRT-LLM's do).
    precision: what the engine computed in (labkit.precision); default: the preset's engine, or
      the dumps' dtype. It picks the thresholds `compare` uses.
    n_past: for a decode step's dumps, the positions already in the engine's KV cache (the
      tokens are then the step's own); attention maps hold n_past + len(tokens) keys. Default:
      the dumps' first position when they hold positions, else 0.
    step: which forward pass of a folder holding several (0: the first; labkit.dumps.steps).
    """
    t0 = time.perf_counter()
    lab = _open(model)
    integers: dict[str, np.ndarray] = {}
    dumped = read_source(source, integers, step)
    held = dumped_ids(integers)
    ids = _ids(lab, tokens, prompt, held.tokens)
    n_past = held.first_position if n_past is None else int(n_past)
    nmap = _names(names, lab, dumped)
    run = Run(lab.name, engine, ids, lab.stages, {}, piece=lab.piece, explain=lab.explain,
              unembed=lab.reference_engine.unembed, selection_bias=lab.selection_bias, unmapped={},
              n_past=n_past)  # fmt: skip
    stored = [_place_one(lab, run, name, d, nmap, layout) for name, d in dumped.items()]
    stored = [s for s in stored if s]
    if not run.captures:
        raise _nothing_mapped(nmap, dumped)
    run.precision = check_precision(precision or PRESET_PRECISION.get(nmap.preset) or precision_of(stored))
    run.timings = {"load_s": time.perf_counter() - t0}
    return run


def _place_one(lab, run: Run, name: str, d: Dumped, nmap: NameMap, layout) -> str:
    """Place one dumped tensor (its stored dtype), or say in run.unmapped why it has no stage ("")."""
    targets = nmap.resolve(name)
    if isinstance(targets, str):
        run.unmapped[name] = targets
        return ""
    taken = [t.stage for t in targets if t.stage in run.captures]
    if taken:
        run.unmapped[name] = f"a second tensor for {taken[0]} (the first one is kept)"
        return ""
    _place(lab, run, name, d, targets, nmap, layout)
    return d.stored


def _open(model: Any):
    from labkit.lab import Lab, open

    return model if isinstance(model, Lab) else open(model)


def _ids(lab, tokens: list[int] | None, prompt: str | None, held: list[int] | None) -> list[int]:
    if tokens is not None and prompt is not None:
        raise InvalidArgumentError("load_dumps takes tokens=[...] or prompt='...', not both")
    if tokens is None and prompt is None:
        if held is None:
            raise InvalidArgumentError("load_dumps needs the token ids the engine ran: tokens=[...] or prompt='...'")
        tokens = held
    ids = lab.prompt_ids(prompt if tokens is None else list(tokens))
    if held is not None and ids != held:
        raise InvalidArgumentError(f"the dumps hold token ids {held[:8]}..., not the {len(ids)} given ({ids[:8]}...)")
    return ids


# "auto" tries these presets only on dumps that carry a name of theirs: SGLang's module paths are the
# Hugging Face ones with fused q;k;v and gate;up, and its act_fn holds act(gate)·up where HF's holds
# act(gate), so a few hf names alone must not read as SGLang's.
AUTO_MARKERS = {
    "sglang": r"forward_batch_info|qkv_proj|gate_up_proj|rotary_emb|non_intrusive__|\]$",
    "trtllm": r"DecoderLayer-",
}


def _names(names: str | Mapping[str, str], lab, dumped: dict[str, Dumped]) -> NameMap:
    if names != "auto":
        return name_map(names, lab.config, lab.graph)
    maps = []
    for p in PRESETS:
        if p in AUTO_MARKERS and not any(re.search(AUTO_MARKERS[p], n) for n in dumped):
            continue
        try:
            maps.append(name_map(p, lab.config, lab.graph))
        except UnknownPresetError:  # a preset that knows no layers of this architecture
            continue
    hits = [sum(not isinstance(m.resolve(n), str) for n in dumped) for m in maps]
    return maps[int(np.argmax(hits))]


def _nothing_mapped(nmap: NameMap, dumped: dict[str, Dumped]) -> UnmappedDumpsError:
    few = ", ".join(list(dumped)[:5]) + (", ..." if len(dumped) > 5 else "")
    return UnmappedDumpsError(
        f"none of the {len(dumped)} dumped names maps onto a stage under {nmap.preset!r} names ({few}); "
        f"choose names= one of {', '.join(PRESETS)}, or a mapping {{their name: stage}}"
    )


def _place(lab, run: Run, name: str, d: Dumped, targets: list[Target], nmap: NameMap, layout) -> None:
    """Read one dumped tensor in its stage's layout, convert it, and store it (each column block
    of a fused tensor under its own stage)."""
    T = len(run.tokens)
    if len(targets) > 1 and targets[0].columns is None:  # the model's weights are separate, the engine's fused
        targets = _column_blocks(lab.config, targets, T)
    fused = targets[0].columns is not None
    width = max(t.columns[1] for t in targets) if fused else None
    e = expect(targets[0].stage, lab.config, T, width, run.n_past)
    reading = choose(name, d.array.shape, e, layout_for(name, targets[0].stage, layout), nmap.prefer)
    a = apply(d.array, reading, e)
    a = a if a.dtype == np.float64 else a.astype(np.float32)
    for t in targets:
        x = a[:, t.columns[0] : t.columns[1]] if fused else a
        x = np.ascontiguousarray(x)
        run.captures[t.stage] = _convert(lab, nmap.graph[t.stage], t.convert, x, reading.t, run.n_past)
        if reading.t != T:
            run.positions[t.stage] = (T - 1,)


def _column_blocks(cfg: ModelConfig, targets: list[Target], T: int) -> list[Target]:
    """Each stage's column range in an engine's fused tensor (SGLang's q;k;v, TensorRT-LLM's gate;up),
    in order, from the stages' own widths."""
    out, start = [], 0
    for t in targets:
        w = expect(t.stage, cfg, T).width
        out.append(Target(t.stage, t.convert, (start, start + w)))
        start += w
    return out


def _convert(lab, stage: Stage, convert: str, a: np.ndarray, rows: int, n_past: int = 0) -> np.ndarray:
    """Make the engine's tensor the quantity labkit's stage holds."""
    if convert == "scores":
        return _scores_from_kq(lab.config, stage, a, rows, n_past)
    if convert == "times_weight":  # the norm's weight, read (and cached) as the reference reads it
        return (a * lab.reference_engine.weight(stage.weight)).astype(a.dtype)
    if convert == "gguf_rows":  # per head [halves: 2, head_dim/2] → the file's [pairs: head_dim/2, 2]
        half = lab.config.head_dim // 2
        return np.ascontiguousarray(a.reshape(a.shape[0], -1, 2, half).swapaxes(2, 3)).reshape(a.shape)
    return a


def _scores_from_kq(cfg: ModelConfig, stage: Stage, kq: np.ndarray, rows: int, n_past: int = 0) -> np.ndarray:
    """llama.cpp's raw q·k [heads, q, n_past + T] → × the softmax scale, then the causal/sliding mask
    as -inf (what its soft_max_ext adds)."""
    from labkit.ops.attn_scores import attention_mask

    scale = 1.0 if cfg.q_prescaled else cfg.attn_scale  # llama.cpp's kq: raw q·k, or q already scaled
    T = kq.shape[2] - n_past
    allowed = attention_mask(T, n_past, stage.params.get("window"))[T - rows :]
    return np.where(allowed[None], kq * np.float32(scale), -np.inf).astype(kq.dtype)
