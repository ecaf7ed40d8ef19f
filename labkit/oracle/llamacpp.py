"""llama.cpp as a stage-level oracle: which of its graph nodes is which labkit stage (this module),
and its own intermediate tensors copied out under labkit's stage names (labkit.oracle.llamacpp_run).

The same GGUF file and the same token ids go through llama.cpp (llama-cpp-python's
low-level API, extra `oracle`). An eval callback (`cb_eval`) sees every node of
llama.cpp's compute graph; the F32 nodes that correspond to a labkit stage are
copied out with ggml's own `ggml_backend_tensor_get` (ctypes on the ggml library
shipped inside `llama_cpp/lib`) and reshaped to labkit's layout:

- vectors are [positions, features] (ggml's ne[0] is the fastest dimension, so a
  tensor with ne = [head_dim, heads, T] is read as numpy [T, heads, head_dim] and
  flattened to [T, heads*head_dim]);
- attention maps are [heads, q_pos, k_pos], cropped from llama.cpp's KV-padded
  [n_kv, T, heads] to the T cells this pass wrote;
- `logits` is [T, vocab].

Which labkit stage is which llama.cpp node is data: `MAPPINGS[arch][stage kind]`
is a `Pick` (a node name and its ggml op, or "the node of this op that reads
node X" for llama.cpp's unnamed `node_N` tensors). `NO_COUNTERPART[arch]` lists
the stage kinds llama.cpp has no tensor for, with the reason. docs/llamacpp_names.md
is the same table for people. Every pair was checked numerically against the
float64 reference (same quantity, small NMSE), not only by name.

Every position's logits are requested, so llama.cpp does not prune the last
layer to the last position; flash attention is off, so `kq-L` and
`kq_soft_max-L` exist as tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.errors import LabkitError
from labkit.model.config import ModelConfig
from labkit.model.graph import Stage
from labkit.model.stage_kinds import BY_KIND
from labkit.precision import INT8_ACTIVATION_THRESHOLDS

INSTALL_HINT = "install the oracle extra: pip install labkit[oracle]"


class OracleError(LabkitError):
    """llama.cpp ran but its graph did not look the way the mapping expects."""


@dataclass(frozen=True)
class Pick:
    """How to find one labkit stage among llama.cpp's graph nodes.

    `name` is the node's name with `{L}` for the layer; `op` its ggml op (`ggml_op_name`),
    which tells apart the several nodes llama.cpp gives one name (`Qcur-L` is the
    MUL_MAT, then a RESHAPE view, then the ROPE). When `reads` is set, `name` is
    ignored and the node is the one of op `op` whose src[1] is named `reads` — the
    rule for unnamed `node_N` tensors. Exactly one node per layer must match.
    `layout`: "vec" → [T, features]; "probs" → [heads, q, k] cropped;
    "scores" → kq·scale + mask, both read from the consuming soft_max node, cropped;
    "scan_y" / "scan_state" → the head (y, T·d_inner floats) or the tail (the state) of ggml_ssm_scan's
    one output; "state" → a state copied into llama.cpp's recurrent cache, as one row.
    """

    name: str
    op: str
    layout: str = "vec"
    reads: str | None = None
    note: str = ""
    part: tuple[int, int] | None = None  # (i, n): the i-th of n equal column blocks (phi3's fused gate/up)
    rows: bool = False  # the stage's own `weight_rows` as columns of the node (Mamba-2's z, xBC of ssm_in)
    src: int = 1  # the source `reads` names (ssm_scan's A is its src[3])
    through: str | None = None  # the node is the one reading, as src[0], a node of this op whose src[1] is `reads`
    # the node holds each head repeated in place (Qwen3-Next's q and k, repeated to the value heads): every
    # `repeat`-th head of it (the stage's params say how many)
    unrepeat: bool = False


def default_pick(kind: str, note: str = "") -> Pick:
    """llama.cpp's node for a stage kind in the graph most families share: the stage-kind table's
    `llamacpp` column (labkit.model.stage_kinds), laid out as the kind's output lies."""
    row = BY_KIND[kind]
    if not row.llamacpp:
        raise ValueError(f"llama.cpp leaves {kind} unnamed: a family's mapping must say how to find it")
    name, op = row.llamacpp.split(":")
    layout = {"attn_scores": "scores", "attn_probs": "probs"}.get(kind, "slots" if row.slots or row.exact else "vec")
    return Pick(name, op, layout=layout, note=note)


# what a default node holds where that is not plain [T, features]
NOTES = {
    "attn_norm": "rms_norm(x) * w (the norm-L node before it is unweighted)",
    "q_rope": "same name as the matmul; the ROPE node",
    "k_rope": "same name as the matmul; the ROPE node",
    "attn_scores": "raw q·k; × the soft_max node's scale + its mask (0 / -inf), as soft_max_ext does",
    "attn_ctx": "heads merged: ne [heads*head_dim, T]",
    "ffn_act": "act(gate) * up in one GLU op",
    "logits": "ne [vocab, T]; every position requested",
    "ffn_topk": "I32 [k, T]: the first k of the argsort",
    "ffn_expert_weights": "[k, T] (reshaped to [1, k, T] after)",
    "ffn_moe_gate": "[d_ff_expert, k, T]",
    "ffn_moe_down": "[d_model, k, T]",
    "ffn_moe_out": "the weighted experts' views summed, slot by slot",
}
COMMON_KINDS = (
    *("attn_norm", "k", "v", "q_rope", "k_rope", "attn_scores", "attn_probs", "attn_ctx", "resid_mid"),
    *("ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down", "resid_out", "output_norm", "logits"),
)
MOE_KINDS = (
    *("ffn_router", "ffn_router_probs", "ffn_topk", "ffn_expert_weights", "ffn_moe_gate", "ffn_moe_up"),
    *("ffn_moe_act", "ffn_moe_down", "ffn_moe_out"),
)
MLA_KINDS = (
    *("q_a_norm", "kv_a", "kv_latent", "kv_latent_norm", "k_pe", "k_pe_rope", "q_nope", "q_pe", "q_pe_rope"),
    *("q_absorbed", "q_mla", "k_mla", "v_mla"),
)
SHARED_EXPERT_KINDS = ("ffn_shexp_gate", "ffn_shexp_up", "ffn_shexp_act", "ffn_shexp_down", "ffn_out")


def _defaults(kinds: tuple[str, ...]) -> dict[str, Pick]:
    return {k: default_pick(k, NOTES.get(k, "")) for k in kinds}


def _common(resid_mid: str, act: str, attn_out_note: str) -> dict[str, Pick]:
    """The kinds every family's llama.cpp graph names alike, with the family's residual and GLU names."""
    return {
        **_defaults(COMMON_KINDS),
        "attn_out": Pick("", "MUL_MAT", reads="kqv_out-{L}", note=attn_out_note),
        "resid_mid": Pick(resid_mid, "ADD"),
        "ffn_act": Pick(act, "GLU", note=NOTES["ffn_act"]),
    }


def _moe(weights: str, weights_op: str, act: str) -> dict[str, Pick]:
    """build_moe_ffn's tensors (llama-graph.cpp). Its [features, k, T] tensors read as [T, k, features]."""
    return {
        **_defaults(MOE_KINDS),
        "ffn_expert_weights": Pick(weights, weights_op, layout="slots", note=NOTES["ffn_expert_weights"]),
        "ffn_moe_act": Pick(act, "GLU", layout="slots"),
    }


def _bitnet(scaled: bool) -> dict[str, Pick]:
    """llama.cpp's build_bitnet (models/bitnet.cpp). With per-tensor scales, a matmul's named node is
    the MUL by its scale (build_lora_mm names what it returns; build_ffn names ffn_up_s, ffn_gate_s)."""
    mm = "MUL" if scaled else "MUL_MAT"
    return {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_sub_out-{L}", "named attn_out-L"),
        **{k: Pick(f"{n}-{{L}}", mm) for k, n in (("q", "Qcur"), ("k", "Kcur"), ("v", "Vcur"))},
        "attn_sub_norm": Pick("attn_sub_norm-{L}", "MUL", note="rms_norm(kqv_out) * w, before the output projection"),
        "attn_out": Pick("attn_out-{L}", mm),
        "ffn_gate": Pick("ffn_gate_s-{L}" if scaled else "ffn_gate-{L}", mm),
        "ffn_up": Pick("ffn_up_s-{L}" if scaled else "ffn_up-{L}", mm),
        "ffn_act": Pick("ffn_sub_out-{L}", "GLU", note="the swiglu, renamed: silu(gate) * up"),
        "ffn_sub_norm": Pick("ffn_sub_norm-{L}", "MUL", note="rms_norm(act) * w, before the down projection"),
        "ffn_down": Pick("ffn_down-{L}", mm),
    }


QKV_NODES = (("q", "Qcur"), ("k", "Kcur"), ("v", "Vcur"))

MAPPINGS: dict[str, dict[str, Pick]] = {
    "gemma3": {
        "embed": Pick("inp_scaled", "SCALE", note="`embd` is the unscaled GET_ROWS; labkit's embed has the sqrt(d)"),
        **_common("sa_out-{L}", "ffn_geglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
        "q_norm": default_pick("q_norm"),
        "k_norm": default_pick("k_norm"),
        "post_attn_norm": default_pick("post_attn_norm"),
        "post_ffn_norm": default_pick("post_ffn_norm"),
    },
    "llama": {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_swiglu-{L}", "named attn_out-L; found as the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
    },
    "qwen3": {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_swiglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
        "q_norm": default_pick("q_norm"),
        "k_norm": default_pick("k_norm"),
    },
    "gemma2": {
        "embed": Pick("inp_scaled", "SCALE", note="`embd` is the unscaled GET_ROWS; labkit's embed has the sqrt(d)"),
        **_common("sa_out-{L}", "ffn_geglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
        "attn_scores": Pick(
            "kq_scaled_2-{L}",
            "SCALE",
            layout="scores",
            note="cap·tanh(kq/cap), the last of kq_scaled_1, kq_tanh, kq_scaled_2 (q was pre-scaled); + the mask",
        ),
        "post_attn_norm": default_pick("post_attn_norm"),
        "post_ffn_norm": Pick(
            "", "MUL", reads="blk.{L}.post_ffw_norm.weight", note="named ffn_post_norm in every layer: found by weight"
        ),
        "logits_raw": Pick("", "MUL_MAT", reads="result_norm", note="the unnamed lm_head matmul before the soft-cap"),
        "logits": Pick("result_output", "SCALE", note="cap·tanh(x/cap): the last SCALE of the final soft-cap"),
    },
    "phi3": {
        "embed": default_pick("embed"),
        **_common("", "ffn_swiglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": Pick("Qcur-{L}", "VIEW", note="a view of the fused wqkv-L matmul (rows q;k;v)"),
        "k": Pick("Kcur-{L}", "VIEW", note="a view of wqkv-L"),
        "v": Pick("Vcur-{L}", "VIEW", note="a view of wqkv-L"),
        "ffn_gate": Pick("ffn_up-{L}", "MUL_MAT", part=(0, 2), note="first half of the fused 2·d_ff up matmul"),
        "ffn_up": Pick("ffn_up-{L}", "MUL_MAT", part=(1, 2), note="second half of the fused up matmul"),
    },
    "qwen3moe": {  # qwen3's attention; build_moe_ffn's tensors (llama-graph.cpp), softmax gating, norm_w
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
        "q_norm": default_pick("q_norm"),
        "k_norm": default_pick("k_norm"),
        **_moe("ffn_moe_weights_norm-{L}", "DIV", "ffn_moe_swiglu-{L}"),
    },
    "bitnet": _bitnet(scaled=False),
    # llama's attention; leading dense layers named as llama's; MoE layers: build_moe_ffn's tensors (the
    # top k ranked on ffn_moe_probs_biased), and the shared experts through build_ffn (ffn_gate-L, ...,
    # the down projection renamed ffn_shexp-L), added to the mixture as ffn_out-L
    "ernie4_5-moe": {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_swiglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        "q": default_pick("q"),
        **_moe("ffn_moe_weights_norm-{L}", "DIV", "ffn_moe_swiglu-{L}"),
        **_defaults(SHARED_EXPERT_KINDS),
    },
    "gpt-oss": {  # llama.cpp's openai-moe graph: biases everywhere, softmax_weight gating (no probabilities)
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "", "attn_out-L: wo's product plus wo_b"),
        **{k: Pick(f"{n}-{{L}}", "ADD", note="matmul + bias") for k, n in QKV_NODES},
        "attn_out": Pick("attn_out-{L}", "ADD", note="wo's product plus wo_b"),
        "ffn_norm": Pick("attn_post_norm-{L}", "MUL", note="the pre-MoE norm (post_attention_norm.weight)"),
        **_moe("ffn_moe_weights_softmax-{L}", "RESHAPE", "ffn_moe_swiglu_oai-{L}"),
        "ffn_router": Pick("ffn_moe_probs-{L}", "ADD", note="logits + router bias, renamed: probs are the logits"),
        "ffn_moe_gate": Pick("ffn_moe_gate_biased-{L}", "ADD_ID", layout="slots", note="each expert's bias added"),
        "ffn_moe_up": Pick("ffn_moe_up_biased-{L}", "ADD_ID", layout="slots"),
        "ffn_moe_down": Pick("ffn_moe_down_biased-{L}", "ADD_ID", layout="slots"),
    },
    # llama.cpp's deepseek2 graph, MLA absorbed (models/deepseek2.cpp): three nodes named q-L (found by
    # weight and op), the latent's view and its norm both kv_cmpr-L, attention over the cache as one key
    # head (kq-L, kqv-L in the latent's space, kqv_out-L after attn_v_b); leading dense layers named as
    # llama's; the MoE's sigmoid probabilities and scaled weights; shared experts through build_ffn
    "deepseek2": {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_swiglu-{L}", "unnamed node_N: the MUL_MAT reading kqv_out-L"),
        **_defaults(MLA_KINDS),
        "q_a": Pick("", "MUL_MAT", reads="blk.{L}.attn_q_a.weight", src=0, note="named q-L; found by its weight"),
        "q": Pick("", "MUL_MAT", reads="blk.{L}.attn_q_b.weight", src=0, note="named q-L; found by its weight"),
        "attn_ctx_latent": Pick("kqv-{L}", "MUL_MAT", layout="heads_first", note="ne [kv_lora, T, heads]"),
        **_moe("ffn_moe_weights_scaled-{L}", "SCALE", "ffn_moe_swiglu-{L}"),
        "ffn_router_probs": Pick("ffn_moe_probs-{L}", "UNARY", note="sigmoid of the logits"),
        **_defaults(SHARED_EXPERT_KINDS),
    },
    "qwen2": {
        "embed": default_pick("embed"),
        **_common("ffn_inp-{L}", "ffn_swiglu-{L}", "named attn_out-L; found as the MUL_MAT reading kqv_out-L"),
        # q/k/v carry a bias: llama.cpp names the ADD of the bias Qcur-L/Kcur-L/Vcur-L.
        "q": Pick("Qcur-{L}", "ADD", note="matmul + bias"),
        "k": Pick("Kcur-{L}", "ADD", note="matmul + bias"),
        "v": Pick("Vcur-{L}", "ADD", note="matmul + bias"),
    },
}


def _mamba2() -> dict[str, Pick]:
    """llama.cpp's build_mamba2_layer (models/mamba-base.cpp), where most nodes are unnamed: each is
    found by a weight it reads, or by the node it reads."""
    ssm_in = "ssm_in's one product: this stage's rows of it"
    return {
        "embed": default_pick("embed"),
        "attn_norm": default_pick("attn_norm", NOTES["attn_norm"]),
        "ssm_z": Pick("", "MUL_MAT", reads="attn_norm-{L}", rows=True, note=ssm_in),
        "ssm_xbc": Pick("", "MUL_MAT", reads="attn_norm-{L}", rows=True, note=ssm_in),
        "ssm_dt": Pick("", "ADD", reads="blk.{L}.ssm_dt.bias", note="dt + dt_bias, before ggml_ssm_scan's softplus"),
        "ssm_conv": Pick(
            "",
            "UNARY",
            reads="blk.{L}.ssm_conv1d.bias",
            through="ADD",
            note="silu(ggml_ssm_conv + conv bias): the SiLU reading the bias ADD",
        ),  # fmt: skip
        "conv_state": Pick(
            "",
            "CPY",
            reads="cache_r_l{L} (view)",
            layout="state",
            note="the window's last d_conv - 1 inputs copied into cache_r_lL",
        ),  # fmt: skip
        "ssm_scan": Pick(
            "",
            "SSM_SCAN",
            reads="blk.{L}.ssm_a",
            src=3,
            layout="scan_y",
            note="ggml_ssm_scan's output: y, then the final state",
        ),  # fmt: skip
        "scan_state": Pick(
            "",
            "SSM_SCAN",
            reads="blk.{L}.ssm_a",
            src=3,
            layout="scan_state",
            note="the tail of ggml_ssm_scan's output, copied into cache_s_lL",
        ),  # fmt: skip
        "ssm_skip": default_pick("ssm_skip", "y + x·D"),
        "ssm_norm": Pick(
            "", "MUL", reads="blk.{L}.ssm_norm.weight", note="rms_norm(silu(z)·y) · ssm_norm over n_group groups"
        ),  # fmt: skip
        "ssm_out": default_pick("ssm_out"),
        "resid_out": default_pick("resid_out"),
        "output_norm": default_pick("output_norm"),
        "logits": default_pick("logits", NOTES["logits"]),
    }


MAPPINGS["mamba2"] = _mamba2()
# Granite 4.0-H (models/granite-hybrid.cpp): build_mamba2_layer's nodes where head_count_kv is 0, llama's
# attention names without rope elsewhere (q, k, v are the products), and qwen3moe's and ernie's FFN names
# (the mixture, then the shared experts through build_ffn); the muP scales: `embd` is the scaled rows, each
# residual ADD (ffn_inp-L, l_out-L) adds the block's SCALE node, and result_output is the logits' SCALE
MAPPINGS["granitehybrid"] = {
    **{k: p for k, p in MAPPINGS["mamba2"].items() if k.startswith(("ssm_", "conv_", "scan_"))},
    **_common("ffn_inp-{L}", "", "named attn_out-L (wo's product, before the residual scale)"),
    "embed": Pick("embd", "SCALE", note="the rows times embedding_scale"),
    "q": default_pick("q"),
    "attn_out": Pick("attn_out-{L}", "MUL_MAT"),
    **_moe("ffn_moe_weights_norm-{L}", "DIV", "ffn_moe_swiglu-{L}"),
    **_defaults(SHARED_EXPERT_KINDS),
    "logits_raw": Pick("", "MUL_MAT", reads="result_norm", note="the lm_head's product before 1/logit_scale"),
    "logits": Pick("result_output", "SCALE", note="the logits divided by logit_scale"),
}
for _kind in ("ffn_gate", "ffn_up", "ffn_act", "ffn_down", "q_rope", "k_rope"):  # a mixture, and no rope
    MAPPINGS["granitehybrid"].pop(_kind)

# Qwen3.5 (models/qwen35.cpp, delta-net-base.cpp, the fused ggml_gated_delta_net that 0.3.36 runs on the CPU):
# the delta net's nodes by their cb names (views and reshapes of contiguous products, read honouring their
# strides), its states through the copies into cache_r_lL and the GDN output's tail; the gated attention's
# queries are the Qcur_reshaped view, its context attn_pregate-L; the FFN reads attn_post_norm-L
DELTA_NET_KINDS = ("ssm_qkv", "ssm_b", "ssm_beta", "ssm_alpha", "ssm_g", "ssm_q", "ssm_k", "ssm_delta")
MAPPINGS["qwen35"] = {
    **_common("attn_residual-{L}", "ffn_swiglu-{L}", "named attn_output-L"),
    **_defaults(("q_full", "q_norm", "k_norm", "attn_gated", *DELTA_NET_KINDS)),
    "embed": Pick("model.input_embed", "GET_ROWS"),
    "output_norm": Pick("h_nextn", "MUL", note="named again result_norm by the GET_ROWS of the outputs"),
    "q": Pick("Qcur_reshaped-{L}", "VIEW", note="each head's query, viewed out of Qcur_full (stride 2·head_dim)"),
    "attn_ctx": Pick("attn_pregate-{L}", "CONT", note="heads merged, before the output gate"),
    "attn_out": Pick("attn_output-{L}", "MUL_MAT"),
    "ffn_norm": Pick("attn_post_norm-{L}", "MUL", note="post_attention_norm, the FFN's input"),
    "ssm_z": Pick("z-{L}", "MUL_MAT"),
    "ssm_conv": Pick("conv_output_silu-{L}", "UNARY", note="silu(ggml_ssm_conv): the conv has no bias"),
    "conv_state": Pick(
        "",
        "CPY",
        reads="conv_state_update-{L}",
        layout="state",
        note="the window's last d_conv - 1 inputs copied into cache_r_lL",
    ),  # fmt: skip
    "scan_state": Pick("new_state-{L}", "VIEW", layout="state", note="the tail of ggml_gated_delta_net's output"),
    "ssm_norm": Pick("final_output-{L}", "RESHAPE", note="rms_norm(o)·ssm_norm·silu(z), heads merged"),
    "ssm_out": Pick("linear_attn_out-{L}", "MUL_MAT"),
}

# Qwen3.5's MoE (models/qwen35moe.cpp): qwen35's nodes, build_moe_ffn's, the shared expert through build_ffn
# and its gate logit (shared_expert_gate-L); ffn_out-L adds the gated shared expert to the mixture
MAPPINGS["qwen35moe"] = {
    **{k: p for k, p in MAPPINGS["qwen35"].items() if k not in ("ffn_gate", "ffn_up", "ffn_act", "ffn_down")},
    **_moe("ffn_moe_weights_norm-{L}", "DIV", "ffn_moe_swiglu-{L}"),
    **_defaults((*SHARED_EXPERT_KINDS, "ffn_shexp_logit")),
}

# Qwen3-Next (models/qwen3next.cpp): qwen35moe's nodes but its own for the embedding, the queries' view
# (Qcur_view-L), b and alpha (views of linear_attn_mixed_ba-L), and q and k, which its graph repeats in place
# to the value heads before q_conv_predelta-L names them
MAPPINGS["qwen3next"] = {
    **MAPPINGS["qwen35moe"],
    "embed": Pick("model.embed_tokens", "GET_ROWS"),
    "q": Pick("Qcur_view-{L}", "VIEW", note="each head's query, viewed out of Qcur_full"),
    "ssm_ba": default_pick("ssm_ba"),
    "ssm_b": Pick("b-{L}", "VIEW", note="each key head's first n_v/n_k values of ssm_ba's product"),
    "ssm_alpha": Pick("a-{L}", "VIEW", note="each key head's last n_v/n_k values"),
    "ssm_beta": Pick("", "UNARY", reads="b-{L} (cont)", src=0, note="sigmoid(b), after a cont of the view"),
    "ssm_q": Pick("q_conv_predelta-{L}", "RESHAPE", unrepeat=True, note="L2-normed, each key head repeated"),
    "ssm_k": Pick("k_conv_predelta-{L}", "RESHAPE", unrepeat=True, note="L2-normed, each key head repeated"),
}

# Nemotron-H (models/nemotron-h.cpp): build_mamba2_layer's nodes; attention without rope (q, k, v are the
# products, attn_out-L names wo's); an FFN layer's ffn_up-L, its relu² (`ffn_sqr(relu)-L`, the SQR) and its down
# projection, which build_cvec's cb names l_out-L; each layer's residual ADD is nemotron_h_block_out-L
MAPPINGS["nemotron_h"] = {
    **{k: p for k, p in MAPPINGS["mamba2"].items() if k != "resid_out"},
    **_defaults(("q", "k", "v", "attn_scores", "attn_probs", "attn_ctx", "ffn_up")),
    "attn_out": Pick("attn_out-{L}", "MUL_MAT"),
    "ffn_act": Pick("ffn_sqr(relu)-{L}", "SQR", note="relu, then its square"),
    "ffn_down": Pick("l_out-{L}", "MUL_MAT", note="ffn_down's product, named l_out-L by build_cvec"),
    "resid_out": Pick("nemotron_h_block_out-{L}", "ADD"),
    "output_norm": Pick("h_nextn", "MUL", note="named again result_norm by the GET_ROWS of the outputs"),
}

# Stage kinds of the architecture's graph that llama.cpp has no tensor for, and why.
# Every stage of all three architectures has a counterpart in llama-cpp-python 0.3.36's
# graph (its libggml 0.25.3), so these are empty. A kind listed here would be absent from
# the oracle's Run, so its stages land in Comparison.missing; `coverage()` names them.
NO_COUNTERPART: dict[str, dict[str, str]] = {
    "gemma3": {},
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "qwen3moe": {},
    "ernie4_5-moe": {},
    "bitnet": {},
    "gpt-oss": {},
    "gemma2": {},
    "mamba2": {},
    "granitehybrid": {},
    "qwen35": {},
    "qwen35moe": {},
    "nemotron_h": {},
    "qwen3next": {},
    "deepseek2": {},
    "phi3": {"resid_mid": "the attention residual ADD is unnamed, and reads no named tensor"},
}
for _kind in NO_COUNTERPART["phi3"]:
    MAPPINGS["phi3"].pop(_kind)

# The thresholds against llama.cpp live with the other precisions' in labkit.precision.
ORACLE_THRESHOLDS = INT8_ACTIVATION_THRESHOLDS


def mapping(arch: str, cfg: ModelConfig | None = None) -> dict[str, Pick]:
    """The arch's stage kind -> llama.cpp node; `cfg` picks a file's variant (BitNet's scaled matmuls)."""
    if arch not in MAPPINGS:
        raise OracleError(f"no llama.cpp name mapping for architecture {arch!r}")
    if arch == "bitnet" and cfg is not None and cfg.weight_scales:
        return _bitnet(scaled=True)
    return MAPPINGS[arch]


def coverage(cfg: ModelConfig, graph: list[Stage]) -> tuple[list[str], list[str]]:
    """(mapped stage names, unmapped stage names) of a graph under the arch's mapping."""
    m = mapping(cfg.arch, cfg)
    mapped = [s.name for s in graph if s.kind in m]
    return mapped, [s.name for s in graph if s.kind not in m]
