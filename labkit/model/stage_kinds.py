"""Every stage kind of every architecture, in one table below both engines.

A kind is a stage name without its layer prefix (`blk.3.ffn_down` → `ffn_down`). Its row gives
the order a layer computes it in (comparisons and tables sort by it, never by the order a caller
listed names in), how its output lies (rows of floats, an attention map, or integer ids), its
max NMSE against the float64 reference at each precision a run can have (labkit.precision says
how each column was measured), its role in the transformer (ROLES: what lab.explain and the
widgets say it does) and the node llama.cpp's graph computes it in (LLAMACPP_NODES: the oracle's
default mapping). KIND_ORDER, the precision tables, the capture layouts, the explanations and
the oracle's mappings derive from it, so a family that brings new kinds adds rows here (and only
where llama.cpp names a node its own way, a line in its oracle mapping).
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
    # "rows": [positions, ...] floats; "heads": [heads, queries, keys]; "ids": integers; "state": one row,
    # a layer's recurrent state after the pass (never cut to positions)
    layout: str = "rows"
    top_level: bool = False  # outside the layers: no `blk.L.` prefix
    slots: bool = False  # [T, k, ...]: one entry per selected expert, in the order of the layer's ffn_topk
    role: str = ""  # what it does in the transformer (ROLES)
    llamacpp: str = ""  # llama.cpp's node for it, NAME:GGML_OP (LLAMACPP_NODES)

    @property
    def exact(self) -> bool:
        """Integer outputs (the selected experts' ids) are compared as sets, never by NMSE."""
        return self.layout == "ids"


# what each kind does in the transformer: lab.explain's `role`, shown by every widget
ROLES: dict[str, str] = {
    "embed": (
        "the first residual stream: each token id becomes a learned vector of d_model numbers (Gemma "
        "multiplies it by √d_model)"
    ),
    "attn_norm": (
        "normalizes the residual stream before attention, so the block sees inputs of a steady scale "
        "whatever the stream's size"
    ),
    "q": ("the query projection: for each head, what this position is looking for in the other positions"),
    "k": (
        "the key projection: for each KV head, what this position offers to the queries that look for it."
        " It is cached (the KV cache) so later tokens can attend to it"
    ),
    "v": (
        "the value projection: for each KV head, what this position passes on to the queries that attend "
        "to it. Cached with the keys"
    ),
    "q_full": (
        "Qwen3.5's query projection: each head's query and, beside it, the gate its attention output will be "
        "multiplied by"
    ),
    "q_a": "DeepSeek's low-rank query: the normed stream projected down to q_lora_rank values",
    "q_a_norm": "the low-rank query normalized before it is projected up to every head's query",
    "kv_a": "DeepSeek's one key-value projection a token: the compressed latent, then the rotary key",
    "kv_latent": (
        "the compressed latent (kv_lora_rank values), before its norm: every head's keys and values come from it"
    ),
    "kv_latent_norm": "the latent normalized: what the cache holds for every head, in place of per-head K and V",
    "k_pe": "the rotary key before rotation: rope_dim values a token, shared by every head",
    "k_pe_rope": "the rotary key after rotation (adjacent pairs): cached beside the latent",
    "q_nope": "each head's query part that meets the latent, unrotated",
    "q_pe": "each head's query part that meets the rotary key, before rotation",
    "q_pe_rope": "each head's rotary query part after rotation",
    "q_absorbed": (
        "each head's unrotated query taken into the latent's space by its slice of attn_k_b (absorption: "
        "q·(W_kb c) = (W_kbᵀ q)·c, so the keys never need to be up-projected)"
    ),
    "q_mla": "each head's full query against the cache: its absorbed part, then its rotated part",
    "k_mla": "the cache row the queries score against: the normed latent, then the rotated key (one shared head)",
    "v_mla": "the values the heads mix: the normed latent itself (each head's up-projection comes after the mix)",
    "attn_ctx_latent": "each head's context in the latent's space: the probability-weighted sum of the cached latents",
    "q_norm": "normalizes each head's query (Gemma 3, Qwen 3), keeping the attention scores in range",
    "k_norm": "normalizes each head's key (Gemma 3, Qwen 3)",
    "q_rope": (
        "rotary position embedding on the queries: pairs of features are rotated by angles that grow with"
        " the position, so the dot product of a query and a key depends on how far apart they are"
    ),
    "k_rope": "rotary position embedding on the keys (the rotated keys are what the KV cache holds)",
    "k_cache": "the new keys as a cache of a smaller type holds them (q8_0, q4_0, ...): what attention reads back",
    "v_cache": "the new values as a cache of a smaller type holds them: what the heads mix",
    "q_rot": "the queries turned by a Walsh-Hadamard matrix, as the keys are before a quantized cache (q·k unchanged)",
    "k_rot": "the keys turned by a Walsh-Hadamard matrix before a quantized cache rounds them (an outlier spread out)",
    "v_rot": "the values turned by a Walsh-Hadamard matrix before a quantized cache rounds them",
    "attn_ctx_rot": "the heads' context as attention over rotated values gives it; attn_ctx turns it back (H² = I)",
    "attn_scores": (
        "how well each query matches each key, per head: a scaled dot product. Keys in the future (and, "
        "for a sliding-window layer, too far in the past) are masked to −inf, so a token never sees what "
        "comes after it"
    ),
    "attn_probs": (
        "the attention pattern: each query's scores turned into probabilities over the visible keys (each"
        " row sums to 1; masked keys get 0)"
    ),
    "attn_ctx": (
        "each query's context vector, per head: the average of the value vectors of the positions it "
        "attends to, weighted by attn_probs. This is how information moves between positions"
    ),
    "attn_sub_norm": (
        "BitNet's sub-norm: the heads' context vectors normalized before the output projection, so the "
        "ternary weights see inputs of a steady scale (post-mortem 003's cascade starts here)"
    ),
    "attn_out": (
        "the output projection: the heads' context vectors, concatenated, mapped back to d_model so "
        "attention can add them to the residual stream"
    ),
    "post_attn_norm": (
        "normalizes attention's output before it is added to the residual stream (Gemma's sandwich norm)"
    ),
    "attn_gated": (
        "the heads' context times the sigmoid of the gate each head's query carried (Qwen3.5): a head can "
        "switch its own output off"
    ),
    "ssm_qkv": (
        "the gated delta net's q, k and v in one projection (before its causal conv): k is where a token "
        "writes into the layer's memory, v what it writes, q what it reads back"
    ),
    "ssm_ba": "Qwen3-Next's b and alpha in one projection: for each key head, its value heads' b, then their alpha",
    "ssm_b": "the delta rule's write-strength logits, one per value head",
    "ssm_beta": "the write strength: sigmoid(b), how far each head's memory moves toward this token's value",
    "ssm_alpha": "the delta rule's decay logits per value head, before dt_bias and the softplus",
    "ssm_g": (
        "the log-decay per head: softplus(alpha + dt_bias)·A with A < 0, so the memory keeps e^g < 1 of "
        "itself each token"
    ),
    "ssm_q": "the delta rule's queries: the conv's q, each head divided by its length",
    "ssm_k": "the delta rule's keys: the conv's k, each head a unit vector (what makes the rule a correction)",
    "ssm_delta": (
        "the gated delta rule: each value head's memory [d_v, d_k] decayed by e^g, corrected toward v where "
        "it reads k (strength beta), then read with q. The memory is carried from pass to pass (scan_state)"
    ),
    "ssm_z": (
        "the mixer's gate z (Mamba-2's a slice of ssm_in, the delta net's its own projection): it never enters "
        "the recurrence; silu(z) gates the recurrence's output in the norm"
    ),
    "ssm_xbc": (
        "Mamba-2's x, B and C before the conv: x is what the scan carries (the value), B how a token writes "
        "into the state (the key), C how it reads the state (the query)"
    ),
    "ssm_dt": (
        "Mamba-2's step size per head (with its bias): through a softplus it says how much of the state a "
        "token keeps (small: remember) and how much it writes (large: overwrite)"
    ),
    "ssm_conv": (
        "a short causal convolution over each channel of x, B and C (its last d_conv inputs, the earlier "
        "ones kept in the conv state), then SiLU: local mixing before the long-range scan"
    ),
    "conv_state": (
        "the conv state as the pass leaves it: each channel's last d_conv - 1 inputs, what the next pass's "
        "first tokens convolve with. Its size never grows with the sequence"
    ),
    "ssm_scan": (
        "the selective scan: a state of head_dim × d_state numbers per head that each token decays by "
        "exp(softplus(dt)·A), writes x ⊗ B into, and reads with C: a recurrent memory in place of a KV cache"
    ),
    "scan_state": (
        "the recurrent state as the pass leaves it (Mamba-2's scan state [heads, head_dim, d_state], the delta "
        "net's memory [heads, d_v, d_k]): everything the layer keeps of the sequence so far, the same size at "
        "10 tokens and at 32 000"
    ),
    "ssm_skip": "the scan's output plus D·x, a learned per-head skip around the scan",
    "ssm_norm": (
        "the gated norm: the recurrence's output and silu(z), RMS-normed in groups (Mamba-2 gates before "
        "the norm, the delta net after, each head on its own)"
    ),
    "ssm_out": "the mixer's output projection, back to d_model for the residual stream",
    "resid_mid": (
        "the residual stream after attention: the layer's input plus what attention wrote. Each block "
        "only adds to this running sum, so information from earlier layers is never overwritten"
    ),
    "ffn_norm": "normalizes the residual stream before the feed-forward block",
    "ffn_gate": "the feed-forward block's gate projection up to d_ff features (the GLU's gate)",
    "ffn_up": "the feed-forward block's up projection to d_ff features (the GLU's value)",
    "ffn_act": (
        "the gated linear unit: the gate projection through a nonlinearity (GELU or SiLU) multiplies the "
        "up projection, feature by feature. The nonlinearity is what lets the feed-forward block compute "
        "more than a linear map"
    ),
    "ffn_sub_norm": (
        "BitNet's sub-norm: the gated activation normalized before the down projection, for the same "
        "reason as attn_sub_norm"
    ),
    "ffn_down": ("the feed-forward block's down projection from d_ff back to d_model, added to the residual stream"),
    "ffn_router": (
        "the router: one logit per expert for each token, from which the layer picks the experts that "
        "compute its feed-forward output (a linear layer; gpt-oss adds a bias)"
    ),
    "ffn_router_probs": "the router's probabilities: how much each expert suits this token (softmax over experts)",
    "ffn_topk": "the experts this token is sent to: the k most probable, most probable first (integer ids)",
    "ffn_expert_weights": (
        "how much each selected expert's output counts: its probability, renormalized over the k (gpt-"
        "oss: the softmax of the k selected logits)"
    ),
    "ffn_moe_gate": "each selected expert's gate projection, per token and slot",
    "ffn_moe_up": "each selected expert's up projection, per token and slot",
    "ffn_moe_act": "each selected expert's gated activation, act(gate) · up, per token and slot",
    "ffn_moe_down": "each selected expert's down projection back to d_model, before its weight is applied",
    "ffn_moe_out": "the mixture's output: the k experts' outputs, each times its router weight, summed",
    "ffn_shexp_gate": "the shared experts' gate projection: a dense FFN every token runs beside the routed experts",
    "ffn_shexp_up": "the shared experts' up projection",
    "ffn_shexp_act": "the shared experts' gated activation, act(gate) · up",
    "ffn_shexp_down": "the shared experts' down projection back to d_model",
    "ffn_shexp_logit": (
        "the shared expert's gate logit, one number a token (Qwen3.5's MoE): sigmoid of it weighs the shared "
        "expert's output before it joins the mixture's"
    ),
    "ffn_out": "the feed-forward block's output: the mixture's plus the shared experts'",
    "post_ffn_norm": (
        "normalizes the feed-forward output before it is added to the residual stream (Gemma's sandwich norm)"
    ),
    "resid_out": (
        "the residual stream after the layer: resid_mid plus what the feed-forward block wrote. The next "
        "layer reads this; after the last layer, the final norm and the unembedding turn it into logits"
    ),
    "output_norm": "the final norm: the last residual stream normalized before the unembedding",
    "logits_raw": (
        "the unembedding, before the final soft-cap: the final hidden state scored against every token of"
        " the vocabulary"
    ),
    "logits": (
        "the unembedding: the final hidden state scored against every token of the vocabulary; the "
        "highest logit is the most likely next token (softmax turns logits into probabilities)"
    ),
}

# the node llama.cpp's graph gives each kind, as NAME:GGML_OP ({L}: the layer), in the graph most
# families share (llama's, build_moe_ffn's); "" where llama.cpp leaves it unnamed. A family that
# names it otherwise says so in labkit.oracle.llamacpp.MAPPINGS
LLAMACPP_NODES: dict[str, str] = {
    "embed": "embd:GET_ROWS",
    "attn_norm": "attn_norm-{L}:MUL",
    "q": "Qcur-{L}:MUL_MAT",
    "k": "Kcur-{L}:MUL_MAT",
    "v": "Vcur-{L}:MUL_MAT",
    "q_a": "",
    "q_a_norm": "q-{L}:MUL",
    "kv_a": "kv_cmpr_pe-{L}:MUL_MAT",
    "kv_latent": "kv_cmpr-{L}:VIEW",
    "kv_latent_norm": "kv_cmpr-{L}:MUL",
    "k_pe": "k_pe-{L}:VIEW",
    "k_pe_rope": "k_pe-{L}:ROPE",
    "q_nope": "q_nope-{L}:VIEW",
    "q_pe": "q_pe-{L}:VIEW",
    "q_pe_rope": "q_pe-{L}:ROPE",
    "q_absorbed": "q_nope_absorbed_perm-{L}:PERMUTE",
    "q_mla": "Qcur-{L}:CONCAT",
    "k_mla": "Kcur-{L}:CONCAT",
    "v_mla": "Vcur-{L}:RESHAPE",
    "attn_ctx_latent": "",
    "q_norm": "Qcur_normed-{L}:MUL",
    "k_norm": "Kcur_normed-{L}:MUL",
    "q_rope": "Qcur-{L}:ROPE",
    "k_rope": "Kcur-{L}:ROPE",
    "k_cache": "",
    "v_cache": "",
    "q_rot": "",
    "k_rot": "",
    "v_rot": "",
    "attn_ctx_rot": "",
    "attn_scores": "kq-{L}:MUL_MAT",
    "attn_probs": "kq_soft_max-{L}:SOFT_MAX",
    "attn_ctx": "kqv_out-{L}:CONT",
    "attn_sub_norm": "attn_sub_norm-{L}:MUL",
    "q_full": "Qcur_full-{L}:MUL_MAT",
    "attn_gated": "attn_gated-{L}:MUL",
    "attn_out": "",
    "post_attn_norm": "attn_post_norm-{L}:MUL",
    "ssm_qkv": "linear_attn_qkv_mixed-{L}:RESHAPE",
    "ssm_ba": "linear_attn_mixed_ba-{L}:MUL_MAT",
    "ssm_b": "beta-{L}:RESHAPE",
    "ssm_beta": "beta_sigmoid-{L}:UNARY",
    "ssm_alpha": "alpha-{L}:RESHAPE",
    "ssm_g": "gate-{L}:MUL",
    "ssm_q": "q_conv_predelta-{L}:SCALE",
    "ssm_k": "k_conv_predelta-{L}:SCALE",
    "ssm_delta": "attn_output-{L}:VIEW",
    "ssm_z": "",
    "ssm_xbc": "",
    "ssm_dt": "",
    "ssm_conv": "",
    "conv_state": "",
    "ssm_scan": "",
    "scan_state": "",
    "ssm_skip": "mamba2_y_add_d-{L}:ADD",
    "ssm_norm": "",
    "ssm_out": "mamba_out-{L}:MUL_MAT",
    "resid_mid": "ffn_inp-{L}:ADD",
    "ffn_norm": "ffn_norm-{L}:MUL",
    "ffn_gate": "ffn_gate-{L}:MUL_MAT",
    "ffn_up": "ffn_up-{L}:MUL_MAT",
    "ffn_act": "ffn_swiglu-{L}:GLU",
    "ffn_sub_norm": "ffn_sub_norm-{L}:MUL",
    "ffn_down": "ffn_out-{L}:MUL_MAT",
    "ffn_router": "ffn_moe_logits-{L}:MUL_MAT",
    "ffn_router_probs": "ffn_moe_probs-{L}:SOFT_MAX",
    "ffn_topk": "ffn_moe_topk-{L}:VIEW",
    "ffn_expert_weights": "ffn_moe_weights_norm-{L}:DIV",
    "ffn_moe_gate": "ffn_moe_gate-{L}:MUL_MAT_ID",
    "ffn_moe_up": "ffn_moe_up-{L}:MUL_MAT_ID",
    "ffn_moe_act": "ffn_moe_swiglu-{L}:GLU",
    "ffn_moe_down": "ffn_moe_down-{L}:MUL_MAT_ID",
    "ffn_moe_out": "ffn_moe_out-{L}:ADD",
    "ffn_shexp_gate": "ffn_gate-{L}:MUL_MAT",
    "ffn_shexp_up": "ffn_up-{L}:MUL_MAT",
    "ffn_shexp_act": "ffn_swiglu-{L}:GLU",
    "ffn_shexp_down": "ffn_shexp-{L}:MUL_MAT",
    "ffn_shexp_logit": "shared_expert_gate-{L}:MUL_MAT",
    "ffn_out": "ffn_out-{L}:ADD",
    "post_ffn_norm": "ffn_post_norm-{L}:MUL",
    "resid_out": "l_out-{L}:ADD",
    "output_norm": "result_norm:MUL",
    "logits_raw": "",
    "logits": "result_output:MUL_MAT",
}


def K(name: str, *columns: float, **kw) -> StageKind:
    return StageKind(name, *columns, role=ROLES[name], llamacpp=LLAMACPP_NODES[name], **kw)


# int8's comments: the worst NMSE measured against llama.cpp, gemma3-270m and smollm2-135m, 8 prompts
STAGE_KINDS: tuple[StageKind, ...] = (
    K("embed", 1e-10, 1e-10, 2e-07, 2e-05, top_level=True),  # 8.4e-16: exact dequantization on both sides
    K("attn_norm", 1e-06, 2e-02, 2e-04, 5e-03),  # 3.0e-3
    # DeepSeek's latent attention (deepseek2): projections as q, the latent's norm as q_norm, copies as their source
    K("q_a", 5e-04, 1e-02, 5e-04, 5e-03),
    K("q_a_norm", 1e-05, 2e-02, 2e-05, 1e-03),
    K("q", 5e-04, 1e-02, 5e-04, 5e-03),  # 1.9e-3
    K("k", 5e-04, 2e-02, 5e-04, 5e-03),  # 3.1e-3
    K("v", 5e-04, 5e-02, 5e-04, 2e-02),  # 8.0e-3
    K("q_full", 5e-04, 1e-02, 5e-04, 5e-03),  # qwen35: as q
    K("q_norm", 1e-05, 2e-02, 2e-05, 1e-03),  # 3.4e-3
    K("k_norm", 1e-05, 2e-02, 1e-05, 2e-03),  # 4.8e-3
    K("q_rope", 1e-05, 2e-02, 5e-05, 5e-03),  # 3.4e-3
    K("k_rope", 1e-05, 2e-02, 5e-05, 5e-03),  # 4.8e-3
    # a cache of a smaller type (labkit.model.cache_stages): its writer's, which a clean write keeps exactly
    K("k_cache", 1e-05, 2e-02, 5e-05, 5e-03),
    K("v_cache", 5e-04, 5e-02, 5e-04, 2e-02),
    K("q_rot", 1e-05, 2e-02, 5e-05, 5e-03),  # llama.cpp's rotation around a quantized cache: as what it turns
    K("k_rot", 1e-05, 2e-02, 5e-05, 5e-03),
    K("v_rot", 5e-04, 5e-02, 5e-04, 2e-02),
    K("attn_ctx_rot", 1e-05, 5e-02, 2e-04, 2e-02),
    K("kv_a", 5e-04, 2e-02, 5e-04, 5e-03),
    K("kv_latent", 5e-04, 2e-02, 5e-04, 5e-03),
    K("kv_latent_norm", 1e-05, 2e-02, 2e-05, 2e-03),
    K("k_pe", 5e-04, 2e-02, 5e-04, 5e-03),
    K("q_nope", 5e-04, 1e-02, 5e-04, 5e-03),
    K("q_pe", 5e-04, 1e-02, 5e-04, 5e-03),
    K("q_pe_rope", 1e-05, 2e-02, 5e-05, 5e-03),
    K("k_pe_rope", 1e-05, 2e-02, 5e-05, 5e-03),
    K("q_absorbed", 5e-04, 2e-02, 5e-04, 5e-03),
    K("q_mla", 5e-04, 2e-02, 5e-04, 5e-03),
    K("k_mla", 1e-05, 2e-02, 5e-05, 5e-03),
    K("v_mla", 1e-05, 2e-02, 5e-05, 5e-03),
    K("attn_scores", 1e-05, 1e-02, 1e-04, 2e-02, layout="heads"),  # 2.0e-3
    K("attn_probs", 1e-05, 1e-02, 2e-04, 1e-02, layout="heads"),  # 1.6e-3
    K("attn_ctx_latent", 1e-05, 5e-02, 2e-04, 2e-02),  # deepseek2: as attn_ctx
    K("attn_ctx", 1e-05, 5e-02, 2e-04, 2e-02),  # 8.2e-3
    K("attn_sub_norm", 1e-05, 5e-02, 1e-05, 5e-03),  # bitnet: as post_attn_norm
    K("attn_gated", 1e-05, 5e-02, 2e-04, 2e-02),  # qwen35: as attn_ctx
    K("attn_out", 5e-04, 5e-02, 5e-04, 2e-02),  # 8.3e-3
    K("post_attn_norm", 1e-05, 5e-02, 1e-05, 5e-03),  # 1.6e-2 (gemma3 layer 17)
    # Mamba-2's mixer (mamba2): the projections are matmul rows, the conv and scan f32 loops over the
    # pass's tokens (a prompt's scan runs chunked in the reference, token by token on the GPU)
    # the gated delta net (qwen35): the projections as matmuls, the rule an f32 loop over the pass's tokens
    K("ssm_qkv", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_ba", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_b", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_beta", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_alpha", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_g", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_z", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_xbc", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_dt", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_conv", 5e-04, 2e-02, 5e-04, 1e-02),
    K("conv_state", 5e-04, 2e-02, 5e-04, 1e-02, layout="state"),
    K("ssm_q", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_k", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ssm_delta", 1e-04, 5e-02, 1e-03, 2e-02),
    K("ssm_scan", 1e-04, 5e-02, 1e-03, 2e-02),
    K("scan_state", 1e-04, 5e-02, 1e-03, 2e-02, layout="state"),
    K("ssm_skip", 1e-04, 5e-02, 1e-03, 2e-02),
    K("ssm_norm", 1e-04, 5e-02, 1e-03, 2e-02),
    K("ssm_out", 5e-04, 5e-02, 5e-04, 2e-02),
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
    # shared experts (ernie4_5-moe): a dense FFN's columns
    K("ffn_shexp_gate", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ffn_shexp_up", 5e-04, 2e-02, 5e-04, 2e-02),
    K("ffn_shexp_act", 1e-05, 2e-02, 5e-04, 5e-02),
    K("ffn_shexp_down", 5e-04, 2e-02, 5e-04, 5e-02),
    K("ffn_shexp_logit", 5e-04, 2e-02, 5e-04, 1e-02),
    K("ffn_out", 5e-04, 2e-02, 5e-04, 5e-02),
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
STATE_KINDS = tuple(k.name for k in STAGE_KINDS if k.layout == "state")
SLOT_KINDS = tuple(k.name for k in STAGE_KINDS if k.slots)


def thresholds(column: str) -> dict[str, float]:
    """{kind: max NMSE} of one precision column ("float32", "int8", "float16", "bfloat16")."""
    return {k.name: getattr(k, column) for k in STAGE_KINDS}


def role_of(kind: str) -> str:
    """What a kind does in the transformer ("" for a kind no table row names: a user's own stage)."""
    row = BY_KIND.get(kind)
    return row.role if row else ""


def layout_of(kind: str) -> str:
    """How a kind's output lies: "rows", "heads" or "ids" ("rows" for a kind no table row names)."""
    row = BY_KIND.get(kind)
    return row.layout if row else "rows"


def stage_kind(name: str) -> str:
    """`blk.3.ffn_down` → `ffn_down`; `logits` → `logits`."""
    return name.split(".", 2)[2] if name.startswith("blk.") else name


def is_attention_map(name: str) -> bool:
    """`blk.3.attn_probs` → True: a capture indexed [heads, q_pos, k_pos], not [positions, ...]."""
    return stage_kind(name) in ATTENTION_MAPS
