"""A mixture of experts' numbers, read as llama.cpp's load_hparams reads them: experts, their widths,
which layers are mixtures, shared experts, and the routing (gating function, selection bias, DeepSeek's
expert groups and routed scaling factor)."""

from __future__ import annotations

from typing import Any

from labkit.errors import HyperparameterError, UnsupportedArchitectureError
from labkit.model.arch_traits import ArchTraits
from labkit.model.metadata_values import MAX_EXPERTS, meta_count, meta_per_layer, meta_positive_float

# llama.cpp's llama_expert_gating_func_type, as `<arch>.expert_gating_func` stores it (0: the family's default)
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def moe_fields(meta: dict[str, Any], p: str, traits: ArchTraits, n_layers: int, names: set[str]) -> dict[str, Any]:
    """A mixture of experts' numbers (only the kind of FFN otherwise)."""
    if traits.ffn != "moe":
        return {"ffn": traits.ffn}
    n_expert = meta_count(meta, p + "expert_count", high=MAX_EXPERTS)
    shared = meta_count(meta, p + "expert_shared_count", 0, low=0) if traits.shared_expert_count else 0
    d_ff_expert = meta_per_layer(meta, p + traits.expert_width_key, n_layers)
    return {
        "ffn": "moe",
        "n_expert": n_expert,
        "n_expert_used": meta_count(meta, p + "expert_used_count", high=n_expert),
        "d_ff_expert": d_ff_expert,
        "expert_weights_norm": bool(meta.get(p + "expert_weights_norm", traits.expert_weights_norm)),
        "expert_gating": _gating(meta, p, traits),
        "moe_layers": _moe_layers(meta, p, n_layers, traits) if traits.moe_layout_keys else (),
        "d_ff_shexp": shared * d_ff_expert
        if traits.shared_expert_count
        else (meta_count(meta, p + "expert_shared_feed_forward_length", 0, low=0)),  # fmt: skip
        "expert_selection_bias": traits.expert_selection_bias and any(n.endswith(".exp_probs_b.bias") for n in names),
        **_groups(meta, p, n_expert),
        "expert_weights_scale": meta_positive_float(meta, p + "expert_weights_scale", 1.0) or 1.0,
    }


def _gating(meta: dict[str, Any], p: str, traits: ArchTraits) -> str:
    """The file's gating function where the family reads one (0 or absent: the family's default)."""
    code = int(meta.get(p + "expert_gating_func", 0) or 0)
    if not code:
        return traits.expert_gating
    if code not in GATING_FUNCS:
        raise UnsupportedArchitectureError(
            f"{p}expert_gating_func {code} is not computed by labkit (it computes "
            + ", ".join(f"{k} {v}" for k, v in GATING_FUNCS.items())
            + ")"
        )
    return GATING_FUNCS[code]


def _groups(meta: dict[str, Any], p: str, n_expert: int) -> dict[str, int]:
    """DeepSeek-V3's expert groups, checked as llama.cpp's load_hparams asserts them."""
    groups = meta_count(meta, p + "expert_group_count", 0, low=0)
    if groups <= 1:
        return {"expert_groups": 0, "expert_groups_used": 0}
    used = meta_count(meta, p + "expert_group_used_count", high=groups)
    if groups >= n_expert or n_expert % groups:
        raise HyperparameterError(
            f"{p}expert_group_count {groups} must divide {p}expert_count {n_expert} into groups of 2 or more"
        )
    if n_expert // groups < 2:
        raise HyperparameterError(f"{p}expert_group_count {groups}: a group's score is its best two experts'")
    return {"expert_groups": groups, "expert_groups_used": used}


def _moe_layers(meta: dict[str, Any], p: str, n_layers: int, traits: ArchTraits) -> tuple[bool, ...]:
    """Which layers are MoE: past the leading dense layers, every interleave_moe_layer_step-th one (ERNIE
    4.5), or every one (DeepSeek, whose files have no step)."""
    lead = meta_count(meta, p + "leading_dense_block_count", 0, low=0)  # past the last layer: all dense, as llama.cpp
    step = meta_count(meta, p + "interleave_moe_layer_step") if traits.moe_step_key else 1
    layers = tuple(L >= lead and (L + 1) % step == 0 for L in range(n_layers))
    if not all(layers) and p + "feed_forward_length" not in meta:
        raise HyperparameterError(f"GGUF metadata lacks {p}feed_forward_length, the width of its dense layers")
    return layers
