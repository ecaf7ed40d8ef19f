"""ModelConfig: the architecture's numbers, read from GGUF metadata once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from labkit.errors import ModelFileError, UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = ("gemma3", "llama", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the stage graph and both executors need to know about a model."""

    arch: str
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float  # global layers
    rope_base_local: float  # sliding-window layers (gemma3: 10 000)
    rope_style: str  # "neox" (pairs i, i+d/2) or "normal" (pairs 2i, 2i+1)
    rope_dim: int
    sliding_window: int | None
    swa_layers: tuple[bool, ...]  # True where the layer uses the sliding window
    tied_embeddings: bool
    embed_scale: float  # gemma multiplies the embedding by sqrt(d_model)
    attn_scale: float
    qk_norm: bool  # gemma3's per-head RMSNorm on q and k
    sandwich_norms: bool  # gemma3's post-attention and post-FFN norms
    ffn_act: str  # "gelu_tanh" or "silu"
    qkv_bias: bool
    bos_id: int | None
    eos_id: int | None
    add_bos: bool

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.swa_layers[layer] else self.rope_base

    def layer_window(self, layer: int) -> int | None:
        return self.sliding_window if self.swa_layers[layer] else None


def _get(meta: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in meta:
        return meta[key]
    if default is ...:
        raise ModelFileError(f"GGUF metadata lacks required key {key!r}")
    return default


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    """Build a ModelConfig the way llama.cpp's llm_load_hparams does for these architectures."""
    arch = str(_get(meta, "general.architecture"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    p = arch + "."
    n_layers = int(_get(meta, p + "block_count"))
    d_model = int(_get(meta, p + "embedding_length"))
    n_heads = int(_get(meta, p + "attention.head_count"))
    n_kv_heads = int(_get(meta, p + "attention.head_count_kv", n_heads))
    head_dim = int(_get(meta, p + "attention.key_length", d_model // n_heads))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_size = int(_get(meta, p + "vocab_size", len(tokens) if tokens is not None else 0))
    rope_base = float(_get(meta, p + "rope.freq_base", 10000.0))
    is_gemma = arch == "gemma3"

    sliding_window = meta.get(p + "attention.sliding_window")
    if is_gemma:
        # llama.cpp: gemma3 uses a sliding window on 5 of every 6 layers, local rope base 10 000.
        pattern = int(meta.get(p + "attention.sliding_window_pattern", 6))
        swa = tuple(layer % pattern < pattern - 1 for layer in range(n_layers))
        rope_base_local = 10000.0
    else:
        sliding_window = None
        swa = (False,) * n_layers
        rope_base_local = rope_base

    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", arch != "llama"))
    return ModelConfig(
        arch=arch,
        name=str(meta.get("general.name", arch)),
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=int(_get(meta, p + "feed_forward_length")),
        vocab_size=vocab_size,
        context_length=int(_get(meta, p + "context_length", 2048)),
        rms_eps=float(_get(meta, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=rope_base,
        rope_base_local=rope_base_local,
        rope_style="normal" if arch == "llama" else "neox",
        rope_dim=int(meta.get(p + "rope.dimension_count", head_dim)),
        sliding_window=int(sliding_window) if sliding_window else None,
        swa_layers=swa,
        tied_embeddings="output.weight" not in tensor_names,
        embed_scale=math.sqrt(d_model) if is_gemma else 1.0,
        attn_scale=1.0 / math.sqrt(head_dim),
        qk_norm=is_gemma,
        sandwich_norms=is_gemma,
        ffn_act="gelu_tanh" if is_gemma else "silu",
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        bos_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
        add_bos=add_bos,
    )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
