"""Every stage kind of every architecture, in one table below both engines.

A kind is a stage name without its layer prefix (`blk.3.ffn_down` → `ffn_down`). Its row gives
the order a layer computes it in (comparisons and tables sort by it, never by the order a caller
listed names in), how its output lies (rows of floats, an attention map, or integer ids), and its
max NMSE against the float64 reference at each precision a run can have (labkit.precision says
how each column was measured). KIND_ORDER, the precision tables and the capture layouts derive
from it, so a family that brings new kinds adds rows here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageKind:
    """One kind's row: its max NMSE per precision, and how its output lies."""

    name: str
    float32: float  # an f32 GPU pass
    int8: float  # an engine that quantizes matmul inputs to 8 bits (llama.cpp)
    float16: float  # activations rounded to f16 between stages
    bfloat16: float
    layout: str = "rows"  # "rows": [positions, ...] floats; "heads": [heads, queries, keys]; "ids": integers
    top_level: bool = False  # outside the layers: no `blk.L.` prefix
    slots: bool = False  # [T, k, ...]: one entry per selected expert, in the order of the layer's ffn_topk

    @property
    def exact(self) -> bool:
        """Integer outputs (the selected experts' ids) are compared as sets, never by NMSE."""
        return self.layout == "ids"


K = StageKind
# int8's comments: the worst NMSE measured against llama.cpp, gemma3-270m and smollm2-135m, 8 prompts
STAGE_KINDS: tuple[StageKind, ...] = (
    K("embed", 1e-10, 1e-10, 2e-07, 2e-05, top_level=True),  # 8.4e-16: exact dequantization on both sides
    K("attn_norm", 1e-06, 2e-02, 2e-04, 5e-03),  # 3.0e-3
    K("q", 5e-04, 1e-02, 5e-04, 5e-03),  # 1.9e-3
    K("k", 5e-04, 2e-02, 5e-04, 5e-03),  # 3.1e-3
    K("v", 5e-04, 5e-02, 5e-04, 2e-02),  # 8.0e-3
    K("q_norm", 1e-05, 2e-02, 2e-05, 1e-03),  # 3.4e-3
    K("k_norm", 1e-05, 2e-02, 1e-05, 2e-03),  # 4.8e-3
    K("q_rope", 1e-05, 2e-02, 5e-05, 5e-03),  # 3.4e-3
    K("k_rope", 1e-05, 2e-02, 5e-05, 5e-03),  # 4.8e-3
    K("attn_scores", 1e-05, 1e-02, 1e-04, 2e-02, layout="heads"),  # 2.0e-3
    K("attn_probs", 1e-05, 1e-02, 2e-04, 1e-02, layout="heads"),  # 1.6e-3
    K("attn_ctx", 1e-05, 5e-02, 2e-04, 2e-02),  # 8.2e-3
    K("attn_sub_norm", 1e-05, 5e-02, 1e-05, 5e-03),  # bitnet: as post_attn_norm
    K("attn_out", 5e-04, 5e-02, 5e-04, 2e-02),  # 8.3e-3
    K("post_attn_norm", 1e-05, 5e-02, 1e-05, 5e-03),  # 1.6e-2 (gemma3 layer 17)
    K("resid_mid", 1e-06, 1e-02, 5e-04, 1e-02),  # 1.4e-3
    K("ffn_norm", 1e-06, 2e-02, 1e-04, 1e-02),  # 3.9e-3
    K("ffn_gate", 5e-04, 2e-02, 5e-04, 1e-02),  # 3.1e-3
    K("ffn_up", 5e-04, 2e-02, 5e-04, 2e-02),  # 3.8e-3
    K("ffn_act", 1e-05, 2e-02, 5e-04, 5e-02),  # 4.7e-3
    K("ffn_sub_norm", 1e-05, 5e-02, 1e-05, 5e-03),  # bitnet: as post_ffn_norm
    K("ffn_down", 5e-04, 2e-02, 5e-04, 5e-02),  # 3.8e-3
    # mixture of experts (qwen3moe): the router, then the selected experts' own FFNs. The float
    # columns are those of the dense kinds they resemble; int8 measured on the tiny MoE files
    K("ffn_router", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ffn_router_probs", 1e-05, 2e-02, 5e-04, 2e-02),
    K("ffn_topk", 0.0, 0.0, 0.0, 0.0, layout="ids"),  # compared exactly, as sets of expert ids per token
    K("ffn_expert_weights", 1e-05, 2e-02, 5e-04, 2e-02, slots=True),
    K("ffn_moe_gate", 5e-04, 2e-02, 5e-04, 1e-02, slots=True),
    K("ffn_moe_up", 5e-04, 2e-02, 5e-04, 2e-02, slots=True),
    K("ffn_moe_act", 1e-05, 2e-02, 5e-04, 5e-02, slots=True),
    K("ffn_moe_down", 5e-04, 2e-02, 5e-04, 5e-02, slots=True),
    K("ffn_moe_out", 5e-04, 2e-02, 5e-04, 5e-02),
    K("post_ffn_norm", 1e-05, 5e-02, 1e-05, 2e-03),  # 9.3e-3
    K("resid_out", 1e-06, 1e-02, 5e-04, 1e-02),  # 2.5e-3
    K("output_norm", 1e-06, 2e-02, 5e-05, 5e-03, top_level=True),  # 3.9e-3
    K("logits_raw", 5e-04, 1e-02, 5e-04, 2e-03, top_level=True),  # gemma2 only: as logits
    K("logits", 5e-04, 1e-02, 5e-04, 2e-03, top_level=True),  # 2.2e-3
)
del K
BY_KIND = {k.name: k for k in STAGE_KINDS}
KIND_ORDER = tuple(k.name for k in STAGE_KINDS)
TOP_LEVEL_KINDS = tuple(k.name for k in STAGE_KINDS if k.top_level)
ATTENTION_MAPS = tuple(k.name for k in STAGE_KINDS if k.layout == "heads")
ID_KINDS = tuple(k.name for k in STAGE_KINDS if k.exact)
SLOT_KINDS = tuple(k.name for k in STAGE_KINDS if k.slots)


def thresholds(column: str) -> dict[str, float]:
    """{kind: max NMSE} of one precision column ("float32", "int8", "float16", "bfloat16")."""
    return {k.name: getattr(k, column) for k in STAGE_KINDS}


def layout_of(kind: str) -> str:
    """How a kind's output lies: "rows", "heads" or "ids" ("rows" for a kind no table row names)."""
    row = BY_KIND.get(kind)
    return row.layout if row else "rows"
