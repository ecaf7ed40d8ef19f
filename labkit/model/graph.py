"""Architectures as data: the ordered stages of a forward pass and the op each runs.

The float64 reference and the GPU executor both walk this same list, so a stage
name means the same tensor everywhere. Each stage reads earlier stages (by name)
and at most one weight tensor; attention stages also see the KV cache of the
positions before this pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.model.config import ModelConfig

# Op families. The GPU executor has one kernel family per op; the reference one numpy function.
OPS = (
    "embed",  # token rows of the embedding, times a scale
    "rmsnorm",  # x / sqrt(mean(x²) + eps) * w, over groups of `group` values
    "matmul",  # x @ W.T (+ bias)
    "rope",  # rotary position embedding, neox or normal pairing
    "attn_scores",  # q·k * scale over cached+new keys, causal/sliding mask → -inf
    "softmax",  # row softmax of the scores
    "attn_ctx",  # probs @ v over cached+new values
    "add",  # residual add
    "glu",  # act(gate) * up
)


@dataclass(frozen=True)
class Stage:
    """One named step. `inputs` are earlier stage names; `weight`/`bias` are GGUF tensor names."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    weight: str | None = None
    bias: str | None = None
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    layer: int | None = None

    @property
    def kind(self) -> str:
        """The stage name without its layer prefix: `blk.3.q_rope` → `q_rope`."""
        return self.name.split(".", 2)[-1] if self.layer is not None else self.name


def build_graph(cfg: ModelConfig) -> list[Stage]:
    """The stage list for gemma3, llama or qwen2, in execution order."""
    stages = [Stage("embed", "embed", (), "token_embd.weight", params={"scale": cfg.embed_scale})]
    x = "embed"
    for L in range(cfg.n_layers):
        x = _layer(cfg, L, x, stages)
    stages.append(Stage("output_norm", "rmsnorm", (x,), "output_norm.weight", params=_norm(cfg, cfg.d_model)))
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    stages.append(Stage("logits", "matmul", ("output_norm",), head, params={"out": cfg.vocab_size}))
    return stages


def _norm(cfg: ModelConfig, group: int) -> dict[str, Any]:
    return {"eps": cfg.rms_eps, "group": group}


def _layer(cfg: ModelConfig, L: int, x: str, out: list[Stage]) -> str:
    p = f"blk.{L}."

    def add(kind: str, op: str, inputs: tuple[str, ...], weight: str | None = None, **params):
        bias = params.pop("bias", None)
        out.append(Stage(p + kind, op, tuple(p + i if i != x else i for i in inputs), weight, bias, params, L))

    def w(name: str) -> str:
        return p + name + ".weight"

    def b(name: str) -> str | None:
        return p + name + ".bias" if cfg.qkv_bias else None

    add("attn_norm", "rmsnorm", (x,), w("attn_norm"), **_norm(cfg, cfg.d_model))
    add("q", "matmul", ("attn_norm",), w("attn_q"), bias=b("attn_q"), out=cfg.q_dim)
    add("k", "matmul", ("attn_norm",), w("attn_k"), bias=b("attn_k"), out=cfg.kv_dim)
    add("v", "matmul", ("attn_norm",), w("attn_v"), bias=b("attn_v"), out=cfg.kv_dim)
    q, k = "q", "k"
    if cfg.qk_norm:
        add("q_norm", "rmsnorm", ("q",), w("attn_q_norm"), **_norm(cfg, cfg.head_dim))
        add("k_norm", "rmsnorm", ("k",), w("attn_k_norm"), **_norm(cfg, cfg.head_dim))
        q, k = "q_norm", "k_norm"
    rope = {
        "base": cfg.layer_rope_base(L),
        "style": cfg.rope_style,
        "head_dim": cfg.head_dim,
        "rope_dim": cfg.rope_dim,
    }
    add("q_rope", "rope", (q,), n_heads=cfg.n_heads, **rope)
    add("k_rope", "rope", (k,), n_heads=cfg.n_kv_heads, **rope)
    add(
        "attn_scores",
        "attn_scores",
        ("q_rope", "k_rope"),
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        scale=cfg.attn_scale,
        window=cfg.layer_window(L),
    )
    add("attn_probs", "softmax", ("attn_scores",))
    add(
        "attn_ctx",
        "attn_ctx",
        ("attn_probs", "v"),
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
    )
    add("attn_out", "matmul", ("attn_ctx",), w("attn_output"), out=cfg.d_model)
    attn = "attn_out"
    if cfg.sandwich_norms:
        add(
            "post_attn_norm",
            "rmsnorm",
            ("attn_out",),
            w("post_attention_norm"),
            **_norm(cfg, cfg.d_model),
        )
        attn = "post_attn_norm"
    out.append(Stage(p + "resid_mid", "add", (x, p + attn), layer=L))
    add("ffn_norm", "rmsnorm", ("resid_mid",), w("ffn_norm"), **_norm(cfg, cfg.d_model))
    add("ffn_gate", "matmul", ("ffn_norm",), w("ffn_gate"), out=cfg.d_ff)
    add("ffn_up", "matmul", ("ffn_norm",), w("ffn_up"), out=cfg.d_ff)
    add("ffn_act", "glu", ("ffn_gate", "ffn_up"), act=cfg.ffn_act)
    add("ffn_down", "matmul", ("ffn_act",), w("ffn_down"), out=cfg.d_model)
    ffn = "ffn_down"
    if cfg.sandwich_norms:
        add("post_ffn_norm", "rmsnorm", ("ffn_down",), w("post_ffw_norm"), **_norm(cfg, cfg.d_model))
        ffn = "post_ffn_norm"
    add("resid_out", "add", ("resid_mid", ffn))
    return p + "resid_out"


def stage_names(graph: list[Stage]) -> list[str]:
    return [s.name for s in graph]
