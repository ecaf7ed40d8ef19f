"""ModelConfig: the architecture's numbers, read from GGUF metadata once (each family's traits are
labkit.model.arch_traits')."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from labkit.errors import HyperparameterError, UnsupportedArchitectureError
from labkit.model.arch_traits import ARCHITECTURES, ArchTraits
from labkit.model.gguf_keys import check_key_types
from labkit.model.latent_attention import MlaShape, mla_head, mla_rope_attn_factor, mla_shape
from labkit.model.metadata_values import (
    MAX_LAYERS,
    in_range,
    meta_count,
    meta_finite,
    meta_per_layer,
    meta_positive_float,
    meta_value,
)
from labkit.model.moe_config import moe_fields
from labkit.ops.rope import UNSCALED


@dataclass(frozen=True)
class SsmShape:
    """A Mamba-2 mixer's sizes, as llama.cpp's hparams hold them (ssm_d_conv, ssm_d_inner, ...)."""

    d_conv: int  # the causal conv's taps (the state keeps d_conv - 1 inputs per channel)
    d_inner: int  # x's width: n_head heads of head_dim
    d_state: int  # the recurrent state's size per head row (B's and C's width per group)
    n_head: int  # llama.cpp's ssm_dt_rank: heads, each with its own dt, A and D
    n_group: int  # B and C are shared by n_head / n_group heads; the gated norm's groups

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_head

    @property
    def conv_dim(self) -> int:
        """The conv's channels: x, B and C."""
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def d_in_proj(self) -> int:
        """ssm_in's rows: z, then xBC, then dt."""
        return self.d_inner + self.conv_dim + self.n_head

    @property
    def conv_state_size(self) -> int:
        """Floats of one layer's conv state: each channel's last d_conv - 1 inputs."""
        return self.conv_dim * (self.d_conv - 1)

    @property
    def scan_state_size(self) -> int:
        """Floats of one layer's scan state: [n_head, head_dim, d_state]."""
        return self.d_inner * self.d_state


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling as llama.cpp's context sets it up from the file: every angle times `freq_scale`
    (1/factor: linear and YaRN), and for YaRN (`ext_factor` 1) the fast-turning dims mixed back to
    their unscaled angle, between the corrections for beta_fast and beta_slow rotations over
    `n_ctx_orig` (labkit.model.rope_scaling.yarn_corr_dims), with cos and sin times 1 + 0.1·ln(factor)."""

    kind: str = "none"  # "none", "linear" or "yarn"
    freq_scale: float = UNSCALED["freq_scale"]
    ext_factor: float = UNSCALED["ext_factor"]
    attn_factor: float = UNSCALED["attn_factor"]  # cparams.yarn_attn_factor: cos and sin times it (and YaRN's own term)
    n_ctx_orig: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def scales(self) -> bool:
        """Whether any angle or magnitude differs from plain RoPE's (decided on the values, not the type)."""
        return any(getattr(self, k) != UNSCALED[k] for k in ("freq_scale", "ext_factor", "attn_factor"))


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
    qk_norm: bool  # per-head RMSNorm on q and k (gemma3, qwen3)
    sandwich_norms: bool  # post-attention and post-FFN norms (gemma2, gemma3)
    ffn_act: str  # "gelu_tanh" or "silu"
    attn_softcap: float  # gemma2: scores → cap·tanh(scores/cap) before the mask; 0 = off
    final_softcap: float  # gemma2: logits → cap·tanh(logits/cap); 0 = off
    fused_qkv: bool  # phi3
    fused_gate_up: bool  # phi3
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    ffn: str = "dense"  # "dense" or "moe"
    sub_norms: bool = False  # bitnet: attn_sub_norm before attn_out, ffn_sub_norm before ffn_down
    weight_scales: bool = False  # bitnet: each matrix times its per-tensor `<name>.scale`
    n_expert: int = 0  # moe: experts per layer
    n_expert_used: int = 0  # moe: experts each token is routed to (top-k)
    d_ff_expert: int = 0  # moe: one expert's feed-forward width
    expert_weights_norm: bool = False  # moe: the k selected weights renormalized to sum to 1
    expert_gating: str = "softmax"  # moe: "softmax", "sigmoid" or "softmax_weight" (ArchTraits.expert_gating)
    # moe: DeepSeek-V3's group-limited routing: experts in `expert_groups` equal groups, each token's top k taken
    # from the `expert_groups_used` groups whose two best scores sum highest (0: no groups)
    expert_groups: int = 0
    expert_groups_used: int = 0
    expert_weights_scale: float = 1.0  # moe: the selected weights times it (DeepSeek's routed_scaling_factor)
    attn_sinks: bool = False  # gpt-oss: `attn_sinks.weight`, a per-head logit in the softmax
    # the matrices the file gives a bias (`blk.0.<matrix>.bias`: qwen2's q/k/v; gpt-oss's q/k/v, output,
    # router and experts, the experts' added by ggml's add_id)
    biases: frozenset[str] = frozenset()
    ffn_norm_tensor: str = "ffn_norm"  # the pre-FFN norm's tensor (gpt-oss: post_attention_norm)
    q_prescaled: bool = False  # llama.cpp's kq-L is already scaled (ArchTraits.q_prescaled)
    rope_scaling: RopeScaling = RopeScaling()  # global layers' (and sliding ones' where swa_rope_scaled)
    swa_rope_scaled: bool = False  # sliding-window layers share rope_scaling's freq_scale (else 1)
    rope_freq_factors: str | None = None  # the tensor each rotary pair's angle is divided by (rope_freqs.weight)
    moe_layers: tuple[bool, ...] = ()  # moe: True where the layer's FFN is the mixture (empty: every layer)
    d_ff_shexp: int = 0  # moe: the shared experts' FFN width, run on every token beside the mixture (0: none)
    expert_selection_bias: bool = False  # moe: `exp_probs_b` added to the probabilities for the top k only
    mixer: str = "attention"  # ArchTraits.mixer: "attention", "mamba2", "hybrid", "delta" or "nemotron"
    ssm: SsmShape | None = None  # the recurrent mixer's sizes (Mamba-2's, or the gated delta net's)
    mla: MlaShape | None = None  # a latent attention's sizes (deepseek2: labkit.model.latent_attention)
    # a hybrid's mixer per layer: "attention", "mamba2", "delta_net", or "ffn" (a Nemotron-H layer that is its FFN)
    mixers: tuple[str, ...] = ()
    attn_gate: bool = False  # ArchTraits.attn_gate: q_full holds each head's query and output gate
    shexp_gate: bool = False  # ArchTraits.shexp_gate: the shared expert times sigmoid of its gate
    fused_ba: bool = False  # ArchTraits.fused_ba: Qwen3-Next's ssm_ba, and its value heads' key heads in place
    rope: bool = True  # the attention layers rotate q and k (a file may turn it off: ArchTraits.rope_switch)
    residual_scale: float = 1.0  # each block's output times it before the residual add (Granite's muP)
    logit_scale: float = 1.0  # the logits divided by it (Granite's muP)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def cache_dims(self) -> tuple[int, int]:
        """What the K and V caches hold a token: K and V of every KV head, or a latent attention's
        latent and rotary key (K) and its latent again (V, which the kernels read as values)."""
        if self.mla is not None:
            return self.mla.cached, self.mla.kv_lora
        return self.kv_dim, self.kv_dim

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.swa_layers[layer] else self.rope_base

    def layer_rope_scaling(self, layer: int) -> RopeScaling:
        """The layer's RoPE scaling: the file's, or none on a sliding-window layer of a family whose
        local layers llama.cpp leaves unscaled (gemma3)."""
        if self.swa_layers[layer] and not self.swa_rope_scaled:  # llama.cpp: rope_freq_scale_train_swa is 1
            return replace(self.rope_scaling, freq_scale=UNSCALED["freq_scale"])
        return self.rope_scaling

    def layer_window(self, layer: int) -> int | None:
        return self.sliding_window if self.swa_layers[layer] else None

    def layer_mixer(self, layer: int) -> str:
        """What mixes the positions in the layer: "attention", "mamba2" or "delta_net"."""
        return self.mixers[layer] if self.mixers else "mamba2" if self.mixer == "mamba2" else "attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend (and so hold a KV cache); a Mamba-2 layer holds a state instead."""
        return tuple(L for L in range(self.n_layers) if self.layer_mixer(L) == "attention")

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The layers that carry a recurrent state from pass to pass."""
        return tuple(L for L in range(self.n_layers) if self.layer_mixer(L) in ("mamba2", "delta_net"))

    def layer_ffn(self, layer: int) -> str:
        """The layer's feed-forward block: "moe", "dense" (a dense FFN, or a leading dense layer) or "none"."""
        if self.ffn == "moe" and (not self.moe_layers or self.moe_layers[layer]):
            return "moe"
        return "none" if self.ffn == "none" else "dense"


def _head_dim(meta: dict[str, Any], p: str, d_model: int, n_heads: int) -> int:
    """The head size: the file's key_length, else d_model / n_heads, which must divide."""
    if p + "attention.key_length" in meta:
        head_dim = meta_count(meta, p + "attention.key_length")
    elif d_model % n_heads:
        raise HyperparameterError(
            f"{p}embedding_length {d_model} is not a multiple of {p}attention.head_count {n_heads}"
        )
    else:
        head_dim = d_model // n_heads
    value = meta_count(meta, p + "attention.value_length", head_dim)
    if value != head_dim:
        raise UnsupportedArchitectureError(
            f"{p}attention.value_length {value} differs from the key length {head_dim}: labkit's attention reads one"
        )
    return head_dim


def _kv_heads(meta: dict[str, Any], p: str, n_heads: int, n_layers: int) -> int:
    n_kv = meta_per_layer(meta, p + "attention.head_count_kv", n_layers, n_heads)
    if n_heads % n_kv:
        raise HyperparameterError(f"{p}attention.head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    return n_kv


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    """Build a ModelConfig the way llama.cpp's llm_load_hparams does for these architectures: every
    key's type checked first (labkit.model.gguf_keys), every count in range, before anything is built."""
    check_key_types(meta)
    arch = str(meta_value(meta, "general.architecture"))
    if arch not in ARCHITECTURES:  # read at call time: a family registered later is supported
        raise UnsupportedArchitectureError(
            f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    traits = ARCHITECTURES[arch]
    p = arch + "."
    n_layers = meta_count(meta, p + "block_count", high=MAX_LAYERS)
    d_model = meta_count(meta, p + "embedding_length")
    tokens = meta.get("tokenizer.ggml.tokens")
    swa, window = _sliding_window(meta, p, traits, n_layers)
    context = meta_count(meta, p + "context_length", 2048)
    vocab = meta_count(meta, p + "vocab_size", len(tokens) if tokens is not None else 0, low=0)
    mixing = _mixing_fields(meta, p, traits, n_layers, d_model, context, tensor_names, vocab)
    head_dim = mixing["head_dim"]
    nemotron_ff = mixing.pop("d_ff", None)  # Nemotron-H: the FFN layers' width, from the per-layer array
    ffn = traits.ffn if traits.ffn != "file" else "moe" if int(meta.get(p + "expert_count", 0) or 0) else "dense"
    traits = replace(traits, ffn=ffn)
    mup = _mup_scales(meta, p) if traits.mup_scales else {}
    return ModelConfig(
        arch=arch,
        name=str(meta.get("general.name", arch)),
        n_layers=n_layers,
        d_model=d_model,
        **mixing,
        d_ff=_ffn_width(meta, p, traits, n_layers, nemotron_ff),
        vocab_size=vocab,
        context_length=context,
        rms_eps=meta_positive_float(meta, p + "attention.layer_norm_rms_epsilon", 1e-6),
        sliding_window=int(window) if window else None,
        swa_layers=swa,
        tied_embeddings="output.weight" not in tensor_names or traits.always_tied,
        embed_scale=mup.get("embed", math.sqrt(d_model) if traits.embed_scale else 1.0),
        attn_scale=_attn_scale(mup, head_dim, mixing["mla"]),
        qk_norm=traits.qk_norm,
        sandwich_norms=traits.sandwich_norms,
        ffn_act=traits.ffn_act,
        biases=_bias_matrices(tensor_names),
        attn_sinks=traits.attn_sinks,
        ffn_norm_tensor=traits.ffn_norm,
        q_prescaled=traits.q_prescaled,
        **_softcaps(meta, p, traits),
        fused_qkv=traits.fused_qkv,
        fused_gate_up=traits.fused_gate_up,
        bos_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", arch != "llama")),
        **moe_fields(meta, p, traits, n_layers, tensor_names),
        sub_norms=traits.sub_norms,
        weight_scales="blk.0.attn_q.scale" in tensor_names,
        residual_scale=mup.get("residual", 1.0),
        logit_scale=mup.get("logit", 1.0),
        attn_gate=traits.attn_gate,
        shexp_gate=traits.shexp_gate,
        fused_ba=traits.fused_ba,
    )


def _attn_scale(mup: dict[str, float], head_dim: int, mla: MlaShape | None) -> float:
    """The softmax scale: Granite's from the file, a latent attention's (YaRN's mscale in it), else 1/sqrt(head)."""
    if mla is not None:
        return mla.kq_scale
    return mup.get("attention", 1.0 / math.sqrt(head_dim) if head_dim else 1.0)


def _ffn_width(meta: dict[str, Any], p: str, traits: ArchTraits, n_layers: int, layer_widths) -> Any:
    """Each layer's FFN width: Nemotron-H's from its per-layer array (layer_widths), else the file's key."""
    if layer_widths is not None:
        return layer_widths
    return meta_per_layer(meta, p + "feed_forward_length", n_layers, ... if traits.ffn == "dense" else 0, low=0)


def _softcaps(meta: dict[str, Any], p: str, traits: ArchTraits) -> dict[str, float]:
    """gemma2's soft-caps of the scores and the logits, with llama.cpp's defaults; 0 where a family has none."""
    if not traits.softcaps:
        return {"attn_softcap": 0.0, "final_softcap": 0.0}
    return {
        "attn_softcap": meta_positive_float(meta, p + "attn_logit_softcapping", 50.0),
        "final_softcap": meta_positive_float(meta, p + "final_logit_softcapping", 30.0),
    }


def _mixing_fields(meta: dict[str, Any], p: str, traits: ArchTraits, n_layers: int, d_model: int, context: int,
                   names: set[str], vocab: int) -> dict[str, Any]:  # fmt: skip
    """What mixes the positions: the attention's heads and rope, each layer's mixer, the Mamba-2 sizes."""
    mixers: tuple[str, ...] = ()
    mla = None
    if traits.mixer == "mamba2":  # no layer attends: llama.cpp's mamba2 files say head_count 0
        n_heads = n_kv_heads = head_dim = 0
        rope = _no_rope(traits)
    else:
        n_heads = meta_per_layer(meta, p + "attention.head_count", n_layers)
        head_dim = _head_dim(meta, p, d_model, n_heads) if traits.mixer != "mla" else mla_head(meta, p)
        if traits.mixer == "hybrid":
            n_kv_heads, mixers = _hybrid_layers(meta, p, n_heads, n_layers)
        elif traits.mixer == "nemotron":
            if int(meta.get(p + "expert_count", 0) or 0):
                raise UnsupportedArchitectureError(
                    "Nemotron-H's mixture of experts (Nemotron 3: sigmoid routing, latent experts) is not supported: "
                    "labkit runs its dense layers"
                )
            n_kv_heads, mixers, d_ff = _nemotron_layers(meta, p, n_heads, n_layers)
        elif traits.mixer == "mla":  # the multi-head form's numbers: each head a key of nope + rope values
            n_kv_heads = n_heads
        else:
            n_kv_heads = _kv_heads(meta, p, n_heads, n_layers)
        if traits.mixer == "delta":
            mixers = _delta_layers(meta, p, n_layers)
        rope = _rope_fields(meta, p, traits, head_dim, context, names)
        if traits.mixer == "mla":
            rope, mla = _mla(meta, p, n_layers, vocab, rope)
        if traits.text_mrope:
            _check_text_sections(meta, p, rope["rope_dim"])
        if traits.fused_ba and "blk.0.ssm_in.weight" in names:
            raise UnsupportedArchitectureError(
                "this Qwen3-Next file has the legacy fused ssm_in (q, k, v and z interleaved per key head): labkit "
                "runs the current converter's split attn_qkv and attn_gate"
            )
    extra = {"d_ff": d_ff} if traits.mixer == "nemotron" else {}
    return {
        **extra,
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "head_dim": head_dim,
        **rope,
        "mixer": traits.mixer,
        "mixers": mixers,
        "ssm": _ssm_shape(meta, p, d_model, traits.mixer) if traits.mixer not in ("attention", "mla") else None,
        "mla": mla,
        "rope": bool(meta.get(p + "rope.scaling.finetuned", True)) if traits.rope_switch else traits.rotary,
    }


def _mla(
    meta: dict[str, Any], p: str, n_layers: int, vocab: int, rope: dict[str, Any]
) -> tuple[dict[str, Any], MlaShape]:
    """A latent attention's sizes (llama.cpp tells a "lite" model by its layers and vocabulary), and its rope's
    attention factor as llama.cpp's deepseek2 sets it."""
    scaling = replace(rope["rope_scaling"], attn_factor=mla_rope_attn_factor(meta, p, rope["rope_scaling"]))
    return {**rope, "rope_scaling": scaling}, mla_shape(meta, p, n_layers, vocab, rope["rope_dim"], scaling)


def _hybrid_layers(meta: dict[str, Any], p: str, n_heads: int, n_layers: int) -> tuple[int, tuple[str, ...]]:
    """(KV heads, each layer's mixer) of a hybrid, as llama.cpp's granitehybrid reads them: a layer is
    Mamba-2 where its head_count_kv is 0; the attending layers share one KV head count."""
    value = meta_value(meta, p + "attention.head_count_kv")
    per = [int(v) for v in value] if isinstance(value, (np.ndarray, list, tuple)) else [int(value)] * n_layers
    if len(per) != n_layers:
        raise HyperparameterError(f"{p}attention.head_count_kv has {len(per)} entries for {n_layers} layers")
    kv = {in_range(f"{p}attention.head_count_kv[{i}]", v, 0, n_heads) for i, v in enumerate(per)} - {0}
    if len(kv) > 1:
        raise UnsupportedArchitectureError(f"{p}attention.head_count_kv differs between layers ({sorted(kv)})")
    n_kv = kv.pop() if kv else n_heads
    if n_heads % n_kv:
        raise HyperparameterError(f"{p}attention.head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    return n_kv, tuple("mamba2" if v == 0 else "attention" for v in per)


def _per_layer_counts(meta: dict[str, Any], key: str, n_layers: int) -> list[int]:
    value = meta_value(meta, key)
    per = [int(v) for v in value] if isinstance(value, (np.ndarray, list, tuple)) else [int(value)] * n_layers
    if len(per) != n_layers:
        raise HyperparameterError(f"{key} has {len(per)} entries for {n_layers} layers")
    return per


def _nemotron_layers(meta: dict[str, Any], p: str, n_heads: int, n_layers: int) -> tuple[int, tuple[str, ...], int]:
    """(KV heads, each layer's block, the FFN width) as llama.cpp's nemotron_h reads them: a layer is Mamba-2
    where its head_count_kv and feed_forward_length are both 0, attention where only its feed_forward_length
    is, an FFN elsewhere; the attending layers share one KV head count, the FFN layers one width."""
    kv = _per_layer_counts(meta, p + "attention.head_count_kv", n_layers)
    ff = _per_layer_counts(meta, p + "feed_forward_length", n_layers)
    mixers = tuple("mamba2" if k == 0 and f == 0 else "attention" if f == 0 else "ffn" for k, f in zip(kv, ff))
    kv_set = {
        in_range(f"{p}attention.head_count_kv[{i}]", v, 1, n_heads)
        for i, v in enumerate(kv)
        if mixers[i] == "attention"
    }
    ff_set = {v for v, m in zip(ff, mixers) if m == "ffn"}
    for key, values in (("attention.head_count_kv", kv_set), ("feed_forward_length", ff_set)):
        if len(values) > 1:
            raise UnsupportedArchitectureError(f"{p}{key} differs between layers ({sorted(values)}): labkit runs one")
    n_kv = kv_set.pop() if kv_set else n_heads
    if n_heads % n_kv:
        raise HyperparameterError(f"{p}attention.head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    return n_kv, mixers, ff_set.pop() if ff_set else 0


def _delta_layers(meta: dict[str, Any], p: str, n_layers: int) -> tuple[str, ...]:
    """Each layer's mixer as llama.cpp's qwen35 reads them: the file's attention.recurrent_layers (true
    where the layer is a gated delta net), else every full_attention_interval-th layer attends (4)."""
    key = p + "attention.recurrent_layers"
    if key in meta:
        flags = list(meta[key]) if isinstance(meta[key], (np.ndarray, list, tuple)) else [meta[key]] * n_layers
        if len(flags) < n_layers:
            raise HyperparameterError(f"{key} has {len(flags)} entries for {n_layers} layers")
        return tuple("delta_net" if bool(f) else "attention" for f in flags[:n_layers])
    step = meta_count(meta, p + "full_attention_interval", 4, high=MAX_LAYERS)
    return tuple("delta_net" if (L + 1) % step else "attention" for L in range(n_layers))


def _check_text_sections(meta: dict[str, Any], p: str, rope_dim: int) -> None:
    """Qwen3.5's interleaved M-RoPE on text: llama.cpp gives a text token the same position in the t, h and
    w sections and 0 in the fourth, so the rope is plain NeoX rope where every rotary pair falls in t, h
    or w (Qwen3.5's [11, 11, 10, 0] over 32 pairs). A file whose sections leave a pair on the fourth
    (unrotated for text) is refused rather than run with a rope it does not have."""
    raw = meta.get(p + "rope.dimension_sections", [rope_dim // 2, 0, 0, 0])
    sections = [int(v) for v in raw][:4] + [0] * max(0, 4 - len(raw))
    if any(v < 0 for v in sections) or sum(sections) == 0:
        raise HyperparameterError(f"{p}rope.dimension_sections is {sections}; it must be 4 counts, not all 0")
    total = sum(sections)
    for i in range(rope_dim // 2):
        s = i % total
        if not any(s % 3 == r and s < 3 * sections[r] for r in (0, 1, 2)):
            raise UnsupportedArchitectureError(
                f"{p}rope.dimension_sections {sections} leave rotary pair {i} in the fourth section: labkit runs "
                "text, where the t, h and w sections share each position"
            )


def _mup_scales(meta: dict[str, Any], p: str) -> dict[str, float]:
    """Granite's muP multipliers where the file has them (llama.cpp reads each as optional; 0 is none)."""
    keys = {"embed": "embedding_scale", "residual": "residual_scale", "attention": "attention.scale",
            "logit": "logit_scale"}  # fmt: skip
    out = {}
    for name, key in keys.items():
        value = meta_finite(meta, p + key, 0.0)
        if value < 0:
            raise HyperparameterError(f"{p}{key} is {value}; it must be 0 (none) or above 0")
        if value:
            out[name] = value
    return out


def _no_rope(traits: ArchTraits) -> dict[str, Any]:
    """The rope fields of a family no layer of which attends (nothing reads them)."""
    return {"rope_base": 10000.0, "rope_base_local": 10000.0, "rope_style": traits.rope_style, "rope_dim": 0,
            "rope_scaling": RopeScaling(), "swa_rope_scaled": False, "rope_freq_factors": None}  # fmt: skip


def _ssm_shape(meta: dict[str, Any], p: str, d_model: int, mixer: str = "mamba2") -> SsmShape:
    """A recurrent mixer's sizes as llama.cpp's load_arch_hparams reads them, checked as its graph
    asserts them (heads and groups divide d_inner). For the gated delta net the same keys say: state_size
    the key head's size, time_step_rank the value heads, group_count the key heads; its value heads
    are the key heads' size (ggml_gated_delta_net asserts S_k == S_v)."""
    shape = SsmShape(
        d_conv=meta_count(meta, p + "ssm.conv_kernel", high=64),
        d_inner=meta_count(meta, p + "ssm.inner_size"),
        d_state=meta_count(meta, p + "ssm.state_size", high=4096),
        n_head=meta_count(meta, p + "ssm.time_step_rank"),
        n_group=meta_count(meta, p + "ssm.group_count", 1),
    )
    for what, n in (("ssm.time_step_rank", shape.n_head), ("ssm.group_count", shape.n_group)):
        if shape.d_inner % n:
            raise HyperparameterError(f"{p}ssm.inner_size {shape.d_inner} is not a multiple of {p}{what} {n}")
    if shape.n_head % shape.n_group:
        raise HyperparameterError(f"{p}ssm.time_step_rank {shape.n_head} is not a multiple of {p}ssm.group_count")
    if mixer == "delta" and shape.head_dim != shape.d_state:
        raise HyperparameterError(
            f"{p}ssm.inner_size / time_step_rank is {shape.head_dim}, the value heads' size; it must equal the key "
            f"heads' size {p}ssm.state_size {shape.d_state}"
        )
    return shape


def _rope_fields(meta: dict[str, Any], p: str, traits: ArchTraits, head_dim: int, context: int,
                 names: set[str]) -> dict[str, Any]:  # fmt: skip
    """RoPE's numbers: bases (global and sliding-window layers'), style, rotary dims, scaling, factors."""
    base = meta_positive_float(meta, p + "rope.freq_base", 10000.0)
    rope_dim = meta_count(meta, p + "rope.dimension_count", head_dim, low=2, high=head_dim)
    if rope_dim % 2:
        raise HyperparameterError(f"{p}rope.dimension_count is {rope_dim}; RoPE rotates pairs, so it must be even")
    return {
        "rope_base": base,
        "rope_base_local": traits.local_rope_base or meta_positive_float(meta, p + "rope.freq_base_swa", base),
        "rope_style": traits.rope_style,
        "rope_dim": rope_dim,
        "rope_scaling": rope_scaling_from_metadata(meta, p, context),
        "swa_rope_scaled": traits.swa_rope_scaled,
        "rope_freq_factors": _rope_freq_factors(traits, names),
    }


def _sliding_window(meta: dict[str, Any], p: str, traits: ArchTraits, n_layers: int) -> tuple[tuple[bool, ...], Any]:
    """Which layers slide a window, and its width: llama.cpp's set_swa_pattern(n), where layer il
    is local when il % n < n - 1 (the file's pattern key, else the family's)."""
    n = traits.swa_pattern
    if not n:
        return (False,) * n_layers, None
    n = meta_count(meta, p + "attention.sliding_window_pattern", n)
    swa = tuple(layer % n < n - 1 for layer in range(n_layers))
    window = meta.get(p + "attention.sliding_window", traits.default_window)
    return swa, None if window is None else in_range(p + "attention.sliding_window", int(window))


def _is_layer0_bias(name: str) -> bool:
    return name.startswith("blk.0.") and name.endswith(".bias")


def _bias_matrices(names: set[str]) -> frozenset[str]:
    """The matrices any layer gives a bias (`blk.L.<matrix>.bias`): a hybrid's layer 0 may lack its FFN's."""
    return frozenset(n.split(".", 2)[2][: -len(".bias")] for n in names if n.startswith("blk.") and n.endswith(".bias"))


MIN_ROPE_FACTOR = 1e-6  # a factor past its reciprocal's range would scale every angle to inf or 0
ROPE_SCALINGS = ("none", "linear", "yarn")  # what labkit computes (longrope's per-dim factors it does not)


def rope_scaling_from_metadata(meta: dict[str, Any], p: str, context: int) -> RopeScaling:
    """RoPE scaling as llama.cpp reads it (llama_model::load_hparams, then llama_context): the type
    defaults to linear, the factor to none (1); YaRN's ext_factor is 1, and its attention factor is
    1 when the file has no yarn_log_multiplier (get_mscale(f) cancelled by 1/(1 + 0.1·ln f), since the
    kernel multiplies that term back), times the file's rope.scaling.attn_factor."""
    kind = str(meta.get(p + "rope.scaling.type", "linear"))
    if kind not in ROPE_SCALINGS:
        raise UnsupportedArchitectureError(
            f"RoPE scaling {kind!r} is not supported (labkit computes {', '.join(ROPE_SCALINGS)})"
        )
    factor = float(meta.get(p + "rope.scaling.factor", meta.get(p + "rope.scale_linear", 0.0)) or 0.0)
    if not (factor == 0.0 or MIN_ROPE_FACTOR <= factor <= 1 / MIN_ROPE_FACTOR):
        raise HyperparameterError(
            f"{p}rope.scaling.factor is {factor}; it must be 0 (none) or between {MIN_ROPE_FACTOR:g} and "
            f"{1 / MIN_ROPE_FACTOR:g}"
        )
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    ext = 1.0 if kind == "yarn" else 0.0
    attn = 1.0
    if ext:
        f = 1.0 / freq_scale
        log_mul = meta_finite(meta, p + "rope.scaling.yarn_log_multiplier", 0.0)
        if _mscale(f, log_mul) <= 0:
            raise HyperparameterError(
                f"{p}rope.scaling.yarn_log_multiplier {log_mul} makes YaRN's magnitude {_mscale(f, log_mul):g}: "
                "it must stay above 0"
            )
        attn = _mscale(f, 1.0) / _mscale(f, log_mul) if log_mul else _mscale(f, 1.0)
        attn /= 1.0 + 0.1 * math.log(f)
    attn *= meta_positive_float(meta, p + "rope.scaling.attn_factor", 1.0)  # whatever the type, as llama.cpp does
    n_ctx_orig = meta_count(meta, p + "rope.scaling.original_context_length", context)
    return RopeScaling(kind, freq_scale, ext, attn, n_ctx_orig)


def _mscale(factor: float, m: float) -> float:
    """llama_context's get_mscale: YaRN's magnitude for a context `factor` times longer."""
    return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0


def _rope_freq_factors(traits: ArchTraits, names: set[str]) -> str | None:
    """The per-pair factors tensor llama.cpp's graph reads, if the file has one; a file whose long-
    context factors depend on the context size (phi3's longrope) is refused, never run unscaled."""
    longrope = [n for n in ("rope_factors_long.weight", "rope_factors_short.weight") if n in names]
    if longrope:
        raise UnsupportedArchitectureError(
            f"RoPE factors {', '.join(longrope)} (longrope) are not supported: labkit computes plain, linear and "
            "YaRN RoPE, and llama3's rope_freqs"
        )
    return "rope_freqs.weight" if traits.rope_freq_factors and "rope_freqs.weight" in names else None


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
