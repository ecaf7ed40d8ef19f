"""The GGUF tensors a family's file holds, read off its stage graph: each tensor a stage reads, by
role, with the shape that stage reads it at. A file writer (labkit.model.tiny, labkit.model.shaped)
walks this list, so a new family's files need no writer code of their own: its ArchTraits and graph
say what is in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.model.config import ModelConfig
from labkit.model.graph import Stage, build_graph


@dataclass(frozen=True)
class FileTensor:
    """One tensor of a file: numpy-order shape, and what it is to a writer."""

    name: str
    shape: tuple[int, ...]
    # "embedding", "matrix", "experts", "router", "norm", "bias", "scale", "sinks", "freq_factors", and
    # the recurrent mixers' "conv", "ssm_a", "ssm_d"
    kind: str


def file_tensors(cfg: ModelConfig, graph: list[Stage] | None = None) -> list[FileTensor]:
    """Every tensor the graph reads, first reader first, a fused weight at its full height."""
    found: dict[str, FileTensor] = {}
    for st in graph or build_graph(cfg):
        for role, name in st.tensors.items():
            t = _tensor(cfg, st, role, name)
            old = found.get(name)
            if old is None or t.shape[0] > old.shape[0]:  # phi3's fused qkv: the widest row range
                found[name] = t if old is None else FileTensor(name, t.shape, old.kind)
    return list(found.values())


def _tensor(cfg: ModelConfig, st: Stage, role: str, name: str) -> FileTensor:
    P = st.params
    if role == "weight_scale":
        return FileTensor(name, (1,), "scale")
    if role == "sinks":
        return FileTensor(name, (cfg.n_heads,), "sinks")
    if role == "freq_factors":
        return FileTensor(name, (cfg.rope_dim // 2,), "freq_factors")
    if role == "bias" and st.op == "moe_router":  # the selection-only bias (exp_probs_b), one per expert
        return FileTensor(name, (cfg.n_expert,), "bias")
    if role == "bias":
        out = (P["out"],)
        return FileTensor(name, (cfg.n_expert, *out) if st.op == "moe_matmul" else out, "bias")
    if st.op == "embed":
        return FileTensor(name, (cfg.vocab_size, cfg.d_model), "embedding")
    if st.op == "rmsnorm":
        return FileTensor(name, (P["group"],), "norm")
    if st.op in _MIXER_TENSORS:  # Mamba-2's, in numpy order ({d_conv, channels} -> [channels, d_conv])
        return FileTensor(name, _MIXER_TENSORS[st.op](P), _MIXER_KINDS[st.op])
    if st.op == "moe_matmul":
        return FileTensor(name, (cfg.n_expert, P["out"], P["in"]), "experts")
    if st.op == "head_matmul":  # DeepSeek's attn_k_b and attn_v_b: a matrix a head
        return FileTensor(name, (P["heads"], P["out"], P["in"]), "matrix")
    rows = st.weight_rows[1] if st.weight_rows else P["out"]
    # a router and the shared expert's gate are kept in F32, as llama.cpp's quantizer keeps them
    router = st.kind in ("ffn_router", "ffn_shexp_logit")
    return FileTensor(name, (rows, P["in"]), "router" if router else "matrix")


# the tensors of Mamba-2's mixer ops, by op: their shapes from the stage's params, and their kinds
_MIXER_TENSORS = {
    "ssm_conv": lambda P: (P["channels"], P["d_conv"]),
    "ssm_scan": lambda P: (P["n_head"], 1),
    "ssm_skip": lambda P: (P["n_head"], 1),
    # one weight row for every head (the gated delta net's ssm_norm [head_v_dim]), or one a group (Mamba-2's)
    "gated_norm": lambda P: (P["group"],) if P.get("w_groups") == 1 else (P["width"] // P["group"], P["group"]),
    "delta_decay": lambda P: (P["n_head"],),
}
_MIXER_KINDS = {
    "ssm_conv": "conv",
    "ssm_scan": "ssm_a",
    "ssm_skip": "ssm_d",
    "gated_norm": "norm",
    "delta_decay": "ssm_a",
}
