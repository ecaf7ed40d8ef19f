"""An architecture as data: what sets each family apart as llama.cpp's llm_build_* for it computes it
(rope style, norms, FFN builder, gating, sinks, window pattern, biases, defaults llama.cpp fixes).
A row of ARCHITECTURES is what a new family made of existing parts needs (docs/architecture.md);
labkit.model.config reads a file's numbers against it."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ArchTraits:
    """What sets an architecture apart, as llama.cpp's llm_build_* for it does."""

    rope_style: str  # "neox" (pairs i, i+d/2) or "normal" (pairs 2i, 2i+1)
    qk_norm: bool = False  # per-head RMSNorm on q and k (gemma3, qwen3)
    sandwich_norms: bool = False  # post-attention and post-FFN norms (gemma2, gemma3)
    ffn_act: str = "silu"
    embed_scale: bool = False  # the embedding times sqrt(d_model) (the gemmas)
    swa_pattern: int = 0  # layers with layer % n < n - 1 use the sliding window (0: none)
    softcaps: bool = False  # attention and final logit soft-capping (gemma2)
    fused_qkv: bool = False  # one attn_qkv weight, rows q;k;v (phi3)
    fused_gate_up: bool = False  # one ffn_up weight, gate rows then up rows (phi3)
    ffn: str = "dense"  # "dense": one gated FFN; "moe": a router picks experts per token; "none" (mamba2)
    sub_norms: bool = False  # RMSNorms before the attention output and the FFN down projection (bitnet)
    # moe: whether the selected experts' weights are renormalized to sum to 1, when the file does
    # not say (`<arch>.expert_weights_norm`); llama.cpp's qwen3moe always renormalizes
    expert_weights_norm: bool = True
    # moe: "softmax" (over all experts, then top k) or "softmax_weight" (top k of the logits, then a
    # softmax over the k: gpt-oss), llama.cpp's expert gating function
    expert_gating: str = "softmax"
    attn_sinks: bool = False  # a learned per-head logit in every attention softmax (gpt-oss)
    ffn_norm: str = "ffn_norm"  # the tensor of the norm before the FFN (gpt-oss: post_attention_norm)
    default_window: int | None = None  # the sliding window when the file has none (gemma2: 4096)
    # sliding-window layers share the file's RoPE scaling (llama.cpp sets rope_freq_scale_train_swa to it:
    # gemma2, gpt-oss); elsewhere they are unscaled (gemma3's local layers)
    swa_rope_scaled: bool = False
    local_rope_base: float | None = None  # the sliding-window layers' RoPE base, fixed (gemma3: 10 000)
    always_tied: bool = False  # the unembedding is token_embd even beside an output.weight (bitnet)
    # llama.cpp's graph scales q itself and calls build_attn with kq_scale 1, so its `kq-L` node is
    # already scaled (gemma2, gemma3, phi3); elsewhere kq is the raw q·k, scaled in the soft_max
    q_prescaled: bool = False
    # the biases its files carry, by matrix (llama.cpp adds each one that is present): what a writer
    # of the family's files writes (labkit.model.file_tensors)
    biases: tuple[str, ...] = ()
    scale_tensors: bool = False  # its files may carry a per-tensor `<matrix>.scale` (bitnet)
    # moe: its files carry `exp_probs_b`, a bias added to the probabilities for the top k only, never
    # to the weights (DeepSeek-V3's e_score_correction_bias; ERNIE 4.5)
    expert_selection_bias: bool = False
    # its graph divides each rotary pair's angle by `rope_freqs.weight` where the file has it (llama:
    # Llama 3.1/3.2's llama3 scaling, written as per-pair factors by the converter)
    rope_freq_factors: bool = False
    # moe: its files say which layers are MoE (`leading_dense_block_count` dense layers first, then every
    # `interleave_moe_layer_step`-th), and may add shared experts (`expert_shared_feed_forward_length`)
    moe_layout_keys: bool = False
    # what mixes the positions in a layer: "attention" (every layer), "mamba2" (every layer a Mamba-2
    # block, llama.cpp's build_mamba2_layer: no attention, no FFN), or "hybrid" (a Mamba-2 block where the
    # file's per-layer head_count_kv is 0, attention elsewhere: granitehybrid)
    mixer: str = "attention"
    # Granite's muP multipliers, from the file: embedding_scale, residual_scale (each block's output
    # before it is added), attention.scale (the softmax scale), logit_scale (the logits divided by it)
    mup_scales: bool = False
    # the file may turn rope off (`rope.scaling.finetuned` false: Granite 4.0-H's attention has no
    # positions but the order the Mamba-2 layers give it)
    rope_switch: bool = False
    # moe: the key of one expert's width (Granite's files give it as feed_forward_length)
    expert_width_key: str = "expert_feed_forward_length"
    # the query projection carries a per-head output gate beside each head's query (attn_q's rows: head 0's
    # query, its gate, head 1's query, ...), and the heads' context is multiplied by its sigmoid (Qwen3.5)
    attn_gate: bool = False
    # moe: the shared expert weighed per token by sigmoid(ffn_gate_inp_shexp · x) (Qwen3.5's MoE, Qwen3-Next)
    shexp_gate: bool = False
    rotary: bool = True  # its attention rotates q and k (Nemotron-H's has no positions but the Mamba-2 layers')
    # delta: Qwen3.5's interleaved M-RoPE sections, which its files must carry (text runs them as plain rope)
    text_mrope: bool = False
    # delta: b and alpha in one projection, interleaved per key head (Qwen3-Next's ssm_ba: for each key head its
    # value heads' b, then their alpha), and a value head reads key head h // (n_v / n_k) rather than h mod n_k
    fused_ba: bool = False
    # moe: the file's leading_dense_block_count is followed by an interleave_moe_layer_step (ERNIE 4.5); without
    # it every later layer is a mixture (DeepSeek)
    moe_step_key: bool = True
    # moe: the shared experts' width is expert_shared_count times an expert's (DeepSeek), not a key of its own
    shared_expert_count: bool = False


GPT_OSS_EXPERT_BIASES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
ARCHITECTURES: dict[str, ArchTraits] = {
    "llama": ArchTraits("normal", rope_freq_factors=True),
    "qwen2": ArchTraits("neox", biases=("attn_q", "attn_k", "attn_v")),
    "qwen3": ArchTraits("neox", qk_norm=True),
    "gemma2": ArchTraits(
        "neox",
        sandwich_norms=True,
        ffn_act="gelu_tanh",
        embed_scale=True,
        swa_pattern=2,
        softcaps=True,
        default_window=4096,
        q_prescaled=True,
        always_tied=True,  # llama.cpp's gemma2 reads no output.weight
        swa_rope_scaled=True,
    ),  # fmt: skip
    "gemma3": ArchTraits(
        "neox",
        qk_norm=True,
        sandwich_norms=True,
        ffn_act="gelu_tanh",
        embed_scale=True,
        swa_pattern=6,
        local_rope_base=10000.0,
        q_prescaled=True,
    ),  # fmt: skip
    # llama.cpp turns phi3's window off
    "phi3": ArchTraits("neox", fused_qkv=True, fused_gate_up=True, q_prescaled=True),
    "qwen3moe": ArchTraits("neox", qk_norm=True, ffn="moe"),
    # ERNIE 4.5 MoE as llama.cpp's ernie4_5-moe graph computes it: llama's attention; leading dense
    # layers, then MoE layers whose router adds a selection-only bias to its probabilities (softmax
    # gating, renormalized), and whose shared experts' FFN is added to the mixture
    "ernie4_5-moe": ArchTraits("normal", ffn="moe", expert_selection_bias=True, moe_layout_keys=True),
    # BitNet b1.58 as llama.cpp's build_bitnet computes it: SiLU, although Microsoft's 2B-4T config says
    # relu2 (llama.cpp's graph was written for 1bitLLM's 3B); the unembedding is always token_embd
    "bitnet": ArchTraits("neox", sub_norms=True, always_tied=True, scale_tensors=True),
    # gpt-oss as llama.cpp's openai-moe graph computes it: even layers slide a window, every attention
    # softmax has a sink, the router's top k are taken on its biased logits and softmaxed over the k,
    # the experts' SwiGLU is clamped (swiglu_oai), and the pre-FFN norm is post_attention_norm
    "gpt-oss": ArchTraits(
        "neox",
        ffn="moe",
        ffn_act="swiglu_oai",
        swa_pattern=2,
        expert_weights_norm=False,
        expert_gating="softmax_weight",
        attn_sinks=True,
        ffn_norm="post_attention_norm",
        swa_rope_scaled=True,
        biases=(*("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp"), *GPT_OSS_EXPERT_BIASES),
    ),
    # Mamba-2 as llama.cpp's mamba2 graph computes it: each layer a norm, the Mamba-2 mixer (a causal
    # conv1d and the selective scan, its state carried from pass to pass) and the residual; no FFN,
    # the output head tied to the embedding unless the file has one
    "mamba2": ArchTraits("neox", mixer="mamba2", ffn="none"),
    # Granite 4.0-H as llama.cpp's granitehybrid graph computes it: Mamba-2 layers where head_count_kv is 0,
    # llama's attention elsewhere (rope only where the file turns it on), every layer a dense FFN or a mixture
    # with shared experts (expert_count in the file), Granite's muP scales
    "granitehybrid": ArchTraits(
        "normal", mixer="hybrid", ffn="file", mup_scales=True, rope_switch=True, expert_width_key="feed_forward_length"
    ),
    # Qwen3.5 as llama.cpp's qwen35 graph computes it: gated delta-net layers, and every
    # full_attention_interval-th layer a gated attention (q/k norms, partial rope; its M-RoPE sections
    # reduce to plain rope for text), each layer's FFN normed by post_attention_norm
    "qwen35": ArchTraits(
        "neox", qk_norm=True, mixer="delta", ffn_norm="post_attention_norm", attn_gate=True, text_mrope=True
    ),
    # Qwen3.5's MoE models as llama.cpp's qwen35moe graph computes them: qwen35's layers, every FFN a mixture
    # (softmax, renormalized) beside a shared expert weighed by its own sigmoid gate
    # Nemotron-H as llama.cpp's nemotron_h graph computes it: each layer one block after its norm, a Mamba-2
    # mixer (head_count_kv and feed_forward_length 0), an attention without rope (feed_forward_length 0), or an
    # FFN of relu² without a gate; the residual after it
    "nemotron_h": ArchTraits("neox", mixer="nemotron", ffn="none", ffn_act="relu_sqr", rotary=False),
    "qwen35moe": ArchTraits(
        "neox",
        qk_norm=True,
        mixer="delta",
        ffn="moe",
        ffn_norm="post_attention_norm",
        attn_gate=True,
        shexp_gate=True,
        text_mrope=True,
    ),
}
# Qwen3-Next as llama.cpp's qwen3next graph computes it: qwen35moe's layers with plain NeoX rope on a quarter
# of each head, b and alpha in one projection interleaved per key head (ssm_ba), and value heads that
# repeat their key head in place (h // (n_v / n_k)); the split q/k/v and z projections (a file with the
# legacy fused ssm_in is refused)
ARCHITECTURES["qwen3next"] = replace(ARCHITECTURES["qwen35moe"], text_mrope=False, fused_ba=True)
# DeepSeek-V2/V3 (and Kimi K2) as llama.cpp's deepseek2 graph computes them: multi-head latent attention
# (mixer "mla": labkit.model.latent_attention) in its absorbed form, rope on adjacent pairs; leading dense
# layers, then mixtures routed by the file's gating function (sigmoid for V3), a selection-only bias, expert
# groups and a routed scaling factor, beside shared experts
ARCHITECTURES["deepseek2"] = ArchTraits(
    "normal",
    mixer="mla",
    ffn="moe",
    expert_selection_bias=True,
    moe_layout_keys=True,
    moe_step_key=False,
    shared_expert_count=True,
    expert_weights_norm=False,
)
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
