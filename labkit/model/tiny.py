"""Tiny synthetic GGUF models written with gguf.GGUFWriter, for fast tests of every path.

Same tensor names and metadata keys as the real files, random weights, and sizes
chosen to exercise the awkward cases: K-quant rows of 256, GQA, a sliding window
shorter than a test prompt (gemma3), q/k/v biases (qwen2), separate or tied heads.
Which tensors a file holds is read off the family's stage graph (labkit.model.file_tensors):
a new family needs its ArchTraits and graph, no writer code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from labkit.model.arch_traits import ARCHITECTURES
from labkit.model.config import ModelConfig, config_from_metadata
from labkit.model.file_tensors import FileTensor, file_tensors
from labkit.quant.formats import QUANT_FORMATS
from labkit.quant.random_blocks import unit_std

Q = GGMLQuantizationType
# bumped whenever the same spec would give other bytes (2: tensors read off the graph, in its order;
# 3: the placeholder merge names tokens the vocabulary has)
WRITER_VERSION = 3


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # any of labkit.model.arch_traits.SUPPORTED_ARCHITECTURES
    weight_type: str = "Q8_0"  # type of the matmul weights
    embed_type: str = "Q8_0"
    n_layers: int = 2
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 512
    vocab: int = 512
    context: int = 256
    sliding_window: int = 4  # gemma2/gemma3/gpt-oss only
    swa_pattern: int = 2  # gemma2/gemma3 only: layers 0, 2, ... local; 1, 3, ... global (gpt-oss's own)
    attn_softcap: float = 3.0  # gemma2 only: small, so that the cap bends these tiny models' scores
    final_softcap: float = 10.0  # gemma2 only: bends the tiny logits (about ±20) without ties at the cap
    tied: bool = True
    seed: int = 0
    # (tensor name suffix, type): matrices stored in another type than weight_type, as llama.cpp's
    # presets mix them (("attn_v.weight", "IQ4_XS"), ...)
    type_overrides: tuple[tuple[str, str], ...] = ()
    n_expert: int = 8  # qwen3moe, gpt-oss: experts per layer
    n_expert_used: int = 2  # qwen3moe, gpt-oss: experts per token
    d_ff_expert: int = 256  # qwen3moe, gpt-oss: one expert's width
    weight_scales: bool = True  # bitnet only: a per-tensor `<matrix>.scale` beside each layer matrix
    n_dense_lead: int = 0  # ernie4_5-moe: leading dense layers (the others are MoE)
    d_ff_shexp: int = 0  # ernie4_5-moe: the shared experts' width (0: none)
    # RoPE scaling as the converters write it: (type, factor, original context length), () for none
    rope_scaling: tuple = ()
    rope_freq_factors: bool = False  # llama only: Llama 3.1's per-pair factors, `rope_freqs.weight`
    # mamba2 only: the mixer's sizes (d_inner is twice d_model, as llama.cpp's converter asserts)
    ssm_d_state: int = 16
    ssm_head_dim: int = 32
    ssm_n_group: int = 2
    ssm_d_conv: int = 4
    # granitehybrid only: each layer's mixer, "M" Mamba-2 and "A" attention (head_count_kv 0 marks an M;
    # "" alternates them, M first);
    # a mixture of experts where n_expert_used > 0 (n_expert experts of d_ff_expert, shared ones of d_ff_shexp)
    layer_pattern: str = ""
    # qwen35 only: the gated delta net's value heads (its key heads are ssm_n_group of ssm_d_state, the
    # value heads the same size), and every full_attention_interval-th layer attends
    ssm_n_v_heads: int = 8
    full_attention_interval: int = 4
    # deepseek2 only: the latent attention's sizes (head_dim is a head's key: nope + rope), and DeepSeek-V3's
    # routing: sigmoid gating, expert groups, a routed scaling factor; n_dense_lead leading dense layers
    mla_q_lora: int = 64
    mla_kv_lora: int = 64
    mla_rope: int = 32
    mla_v_head: int = 32
    expert_groups: tuple[int, int] = (4, 2)  # (groups, groups used); (0, 0): none
    expert_weights_scale: float = 2.5
    expert_gating_func: int = 2  # llama.cpp's: 1 softmax (DeepSeek-V2), 2 sigmoid (V3)
    yarn_log_mul: float = 0.0707  # rope.scaling.yarn_log_multiplier: 0.1 x mscale_all_dim (V2's 0.707)


def encode_tensor(rng: np.random.Generator, values: np.ndarray, type_name: str) -> tuple[np.ndarray, Q]:
    """Values (float32 [rows, cols]) in the GGUF encoding of `type_name`: quantized by gguf.quants where
    it can (float, legacy and ternary types, MXFP4); random valid blocks of about the values' size for
    the others (QuantFormat.random_blocks: K- and I-quants, NVFP4)."""
    fmt = QUANT_FORMATS.get(Q[type_name])
    if fmt is None:  # a type labkit does not read (Q1_0, ...): its size in random bytes, for the typed error
        block, size = GGML_QUANT_SIZES[Q[type_name]]
        return rng.integers(0, 256, (values.shape[0], values.shape[1] // block * size), dtype=np.uint8), Q[type_name]
    if fmt.qtype == Q.F32:
        return values.astype(np.float32), fmt.qtype
    if fmt.qtype == Q.F16:
        return values.astype(np.float16), fmt.qtype
    if fmt.quantizable:
        return quantize(values.astype(np.float32), fmt.qtype), fmt.qtype
    rows, cols = values.shape
    unit = unit_std(fmt, rng, 64)
    raw = fmt.random_blocks(rng, rows * cols // fmt.block_size, float(np.std(values)) / unit)
    return raw.reshape(rows, -1), fmt.qtype


# the registry's small models of families no PyPI package ships (labkit.model.registry): the
# mixture-of-experts case and lesson, and BitNet's norm cascade, run on them
TINY_MODELS = {
    "tiny-qwen3moe": TinySpec(arch="qwen3moe", n_layers=4, n_expert=16, n_expert_used=4, d_ff_expert=256, seed=7),
    # ternary weights without scale tensors, as llama.cpp's converter writes BitNet
    "tiny-bitnet": TinySpec(arch="bitnet", weight_type="TQ2_0", n_layers=4, weight_scales=False, seed=11),
    # ERNIE 4.5's MoE layout at tiny size: a leading dense layer, then MoE layers with shared experts and a
    # selection-only router bias (exp_probs_b)
    "tiny-ernie4_5-moe": TinySpec(
        arch="ernie4_5-moe",
        n_layers=4,
        n_expert=16,
        n_expert_used=4,
        d_ff_expert=256,
        n_dense_lead=1,
        d_ff_shexp=512,
        seed=1,
    ),  # fmt: skip
    # Mamba-2 at tiny size: 4 layers of the mixer alone (no attention, no FFN), heads sharing B and C
    # in 2 groups, K-quant projections of rows 256 wide
    "tiny-mamba2": TinySpec(arch="mamba2", weight_type="Q4_K", n_layers=4, d_model=256, seed=5),
    # Granite 4.0-H at tiny size: Mamba-2 layers around one attention layer without rope, every FFN a
    # mixture with a shared expert, Granite-4.0-H-Tiny's muP scales
    "tiny-granitehybrid": TinySpec(
        arch="granitehybrid",
        weight_type="Q8_0",
        n_layers=4,
        layer_pattern="MAMM",
        n_expert=8,
        n_expert_used=2,
        d_ff_expert=256,
        d_ff_shexp=256,
        seed=9,
    ),  # fmt: skip
    # Qwen3.5 at tiny size: gated delta-net layers and gated attention layers in turn (Qwen3.5's own interval
    # is 4), 8 value heads over 4 key heads of 32, K-quant matrices
    "tiny-qwen35": TinySpec(
        arch="qwen35",
        weight_type="Q4_K",
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        ssm_d_state=32,
        ssm_n_group=4,
        ssm_n_v_heads=8,
        full_attention_interval=2,
        seed=13,
    ),  # fmt: skip
    # Nemotron-H at tiny size: a Mamba-2 layer, an FFN (relu², no gate), an attention layer without rope, then
    # Mamba-2 and an FFN again, as Nemotron-H interleaves them
    "tiny-nemotron_h": TinySpec(arch="nemotron_h", weight_type="Q8_0", n_layers=5, layer_pattern="MFAMF", seed=19),
    # DeepSeek-V3 at tiny size: latent attention with a low-rank query (heads of 32 unrotated + 32 rotated values,
    # a latent of 64) under YaRN (factor 4 from 64 positions, DeepSeek-V2's log multiplier), a leading dense layer,
    # then two mixtures of 8 experts in 4 groups (2 groups, 2 experts a token) under sigmoid gating with a
    # selection bias and a routed scale, beside a shared expert
    "tiny-deepseek2": TinySpec(
        arch="deepseek2",
        weight_type="Q8_0",
        n_layers=3,
        n_dense_lead=1,
        d_ff_shexp=256,
        rope_scaling=("yarn", 4.0, 64),
        seed=23,
    ),
    # Qwen3.5's MoE at tiny size: tiny-qwen35's layers, every FFN 8 experts (2 a token) beside a gated shared one
    "tiny-qwen35moe": TinySpec(
        arch="qwen35moe",
        weight_type="Q4_K",
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        ssm_d_state=32,
        ssm_n_group=4,
        ssm_n_v_heads=8,
        full_attention_interval=2,
        n_expert=8,
        n_expert_used=2,
        d_ff_expert=256,
        d_ff_shexp=256,
        seed=17,
    ),  # fmt: skip
    # Qwen3-Next at tiny size: tiny-qwen35moe's layout with b and alpha in one projection (ssm_ba) and value
    # heads that repeat their key head in place
    "tiny-qwen3next": TinySpec(
        arch="qwen3next",
        weight_type="Q4_K",
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        ssm_d_state=32,
        ssm_n_group=4,
        ssm_n_v_heads=8,
        full_attention_interval=2,
        n_expert=8,
        n_expert_used=2,
        d_ff_expert=256,
        d_ff_shexp=256,
        seed=23,
    ),  # fmt: skip
    # gpt-oss's parts at tiny size: MXFP4 experts (as OpenAI ships them), a sink per head, even layers
    # with a window shorter than a test prompt, biases on attention, router and experts
    "tiny-gpt-oss": TinySpec(
        arch="gpt-oss",
        n_layers=4,
        n_expert=16,
        n_expert_used=4,
        d_ff_expert=256,
        tied=False,
        seed=11,
        type_overrides=(("_exps.weight", "MXFP4"),),
    ),  # fmt: skip
}


def write_tiny_model(
    path: str | Path, spec: TinySpec = TinySpec(), merges: list[str] = (), name: str | None = None
) -> Path:
    """Write a synthetic model; returns the path. `merges`: llama.cpp's gpt2 loader wants at least one."""
    path = Path(path)
    w = GGUFWriter(str(path), spec.arch)
    write_metadata(w, spec, name=name, merges=merges)
    _write_tensors(w, spec, np.random.default_rng(spec.seed))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_metadata(w: GGUFWriter, spec: TinySpec, name: str | None = None, merges: list[str] = ()) -> None:
    """The architecture's keys (as llama.cpp's load_hparams reads them) and a gpt2 vocabulary of
    placeholder tokens (`merges`: llama.cpp's gpt2 loader wants at least one)."""
    a, traits = spec.arch, ARCHITECTURES.get(spec.arch, ARCHITECTURES["llama"])
    # no architecture in the name: llama.cpp keys vocab fix-ups on it ("phi3" wants a "</s>" token)
    w.add_name(name or f"labkit tiny {spec.weight_type}")
    w.add_block_count(spec.n_layers)
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.d_model)
    w.add_layer_norm_rms_eps(1e-6 if a.startswith("gemma") else 1e-5)
    if traits.mixer == "mamba2":
        _ssm_metadata(w, spec)
    else:
        _attention_metadata(w, spec, traits)
    if traits.mixer == "hybrid":
        _hybrid_metadata(w, spec)
    if traits.mixer == "delta":
        _delta_metadata(w, spec)
    if traits.mixer == "nemotron":
        _nemotron_metadata(w, spec)
    if traits.mixer == "mla":
        _mla_metadata(w, spec)
    if spec.rope_scaling:
        kind, factor, n_ctx_orig = spec.rope_scaling
        w.add_string(f"{a}.rope.scaling.type", kind)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(n_ctx_orig)
    w.add_vocab_size(spec.vocab)
    if traits.swa_pattern:
        w.add_sliding_window(spec.sliding_window)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_pattern)
    if traits.ffn == "moe":
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.d_ff_expert)
    if traits.moe_layout_keys:
        w.add_leading_dense_block_count(spec.n_dense_lead)
    if traits.moe_step_key and traits.moe_layout_keys:
        w.add_interleave_moe_layer_step(1)
    if (traits.moe_layout_keys or traits.shexp_gate) and not traits.shared_expert_count:
        w.add_expert_shared_feed_forward_length(spec.d_ff_shexp)
    if traits.softcaps:
        w.add_float32(f"{a}.attn_logit_softcapping", spec.attn_softcap)
        w.add_float32(f"{a}.final_logit_softcapping", spec.final_softcap)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(spec.vocab)])
    w.add_token_types([1] * spec.vocab)
    w.add_token_merges(list(merges))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(a != "llama")


def _attention_metadata(w: GGUFWriter, spec: TinySpec, traits) -> None:
    hybrid, per_layer = traits.mixer == "hybrid", traits.mixer in ("hybrid", "nemotron")
    if traits.mixer != "nemotron":  # Nemotron-H's is per layer (_nemotron_metadata)
        w.add_feed_forward_length(spec.d_ff_expert if hybrid and spec.n_expert_used else spec.d_ff)
    w.add_head_count(spec.n_heads)
    w.add_rope_freq_base(1e6 if spec.arch == "gemma3" else 1e4)
    if traits.mixer == "mla":  # its own key and value lengths, one KV head, its rotary width
        return
    if not per_layer:  # a hybrid's is per layer (_hybrid_metadata, _nemotron_metadata)
        w.add_head_count_kv(spec.n_kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    # Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25)
    w.add_rope_dimension_count(spec.head_dim // 4 if traits.mixer == "delta" else spec.head_dim)


def _mla_metadata(w: GGUFWriter, spec: TinySpec) -> None:
    """deepseek2's keys as its converter writes them: the MLA sizes (key_length the cached row, value_length
    the latent), one KV head, and DeepSeek-V3's routing (sigmoid gating, groups, a routed scaling factor)."""
    a = spec.arch
    w.add_q_lora_rank(spec.mla_q_lora)
    w.add_kv_lora_rank(spec.mla_kv_lora)
    w.add_uint32(f"{a}.attention.key_length_mla", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length_mla", spec.mla_v_head)
    w.add_uint32(f"{a}.attention.key_length", spec.mla_kv_lora + spec.mla_rope)
    w.add_uint32(f"{a}.attention.value_length", spec.mla_kv_lora)
    w.add_uint32(f"{a}.attention.head_count_kv", 1)
    w.add_uint32(f"{a}.rope.dimension_count", spec.mla_rope)
    w.add_uint32(f"{a}.expert_shared_count", spec.d_ff_shexp // spec.d_ff_expert)
    w.add_float32(f"{a}.expert_weights_scale", spec.expert_weights_scale)
    w.add_bool(f"{a}.expert_weights_norm", spec.expert_gating_func == 2)  # V3 renormalizes, V2 does not
    w.add_uint32(f"{a}.expert_gating_func", spec.expert_gating_func)
    if spec.rope_scaling:  # as DeepSeek's converter writes it: 0.1 x mscale_all_dim
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", spec.yarn_log_mul)
    if spec.expert_groups[0]:
        w.add_uint32(f"{a}.expert_group_count", spec.expert_groups[0])
        w.add_uint32(f"{a}.expert_group_used_count", spec.expert_groups[1])


def _ssm_metadata(w: GGUFWriter, spec: TinySpec) -> None:
    """Mamba-2's keys as llama.cpp's converter writes them (no layer attends: head_count 0, no FFN)."""
    d_inner = 2 * spec.d_model
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(spec.ssm_d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(spec.ssm_d_state)
    w.add_ssm_time_step_rank(d_inner // spec.ssm_head_dim)
    w.add_ssm_group_count(spec.ssm_n_group)


def _hybrid_metadata(w: GGUFWriter, spec: TinySpec) -> None:
    """Granite 4.0-H's keys as its converter writes them: the Mamba-2 sizes, head_count_kv 0 on the
    Mamba-2 layers, rope off, the muP scales of Granite-4.0-H-Tiny's config, and its experts."""
    a = spec.arch
    w.add_ssm_conv_kernel(spec.ssm_d_conv)
    w.add_ssm_inner_size(2 * spec.d_model)
    w.add_ssm_state_size(spec.ssm_d_state)
    w.add_ssm_time_step_rank(2 * spec.d_model // spec.ssm_head_dim)
    w.add_ssm_group_count(spec.ssm_n_group)
    pattern = spec.layer_pattern or ("MA" * spec.n_layers)[: spec.n_layers]  # Mamba-2, attention, ...
    w.add_head_count_kv([0 if c == "M" else spec.n_kv_heads for c in pattern])
    w.add_bool(f"{a}.rope.scaling.finetuned", False)
    w.add_float32(f"{a}.embedding_scale", 12.0)
    w.add_float32(f"{a}.residual_scale", 0.22)
    w.add_float32(f"{a}.attention.scale", 0.0078125)
    w.add_float32(f"{a}.logit_scale", 6.0)
    if spec.n_expert_used:  # Granite's experts: feed_forward_length is one expert's width
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_shared_feed_forward_length(spec.d_ff_shexp)


def _nemotron_metadata(w: GGUFWriter, spec: TinySpec) -> None:
    """Nemotron-H's keys as its converter writes them: the Mamba-2 sizes, and per layer a head_count_kv and a
    feed_forward_length that say its block ("M" Mamba-2: both 0; "A" attention: no FFN width; "F" an FFN: no
    KV heads); the layer-norm epsilon llama.cpp requires beside the RMS one."""
    w.add_ssm_conv_kernel(spec.ssm_d_conv)
    w.add_ssm_inner_size(2 * spec.d_model)
    w.add_ssm_state_size(spec.ssm_d_state)
    w.add_ssm_time_step_rank(2 * spec.d_model // spec.ssm_head_dim)
    w.add_ssm_group_count(spec.ssm_n_group)
    pattern = spec.layer_pattern or ("MF" * spec.n_layers)[: spec.n_layers]
    w.add_head_count_kv([spec.n_kv_heads if c == "A" else 0 for c in pattern])
    w.add_feed_forward_length([spec.d_ff if c == "F" else 0 for c in pattern])
    w.add_layer_norm_eps(1e-5)


def _delta_metadata(w: GGUFWriter, spec: TinySpec) -> None:
    """Qwen3.5's keys as llama.cpp's converter writes them: the gated delta net's sizes in the ssm keys
    (state_size the heads' size, time_step_rank the value heads, group_count the key heads, inner_size
    the value heads' width), the attention interval, and M-RoPE sections covering every rotary pair
    the way Qwen3.5's [11, 11, 10, 0] covers its 32."""
    n = spec.head_dim // 8  # rotary pairs
    t, h = -(-n // 3), -(-(n - 1) // 3)
    w.add_ssm_conv_kernel(spec.ssm_d_conv)
    w.add_ssm_inner_size(spec.ssm_n_v_heads * spec.ssm_d_state)
    w.add_ssm_state_size(spec.ssm_d_state)
    w.add_ssm_time_step_rank(spec.ssm_n_v_heads)
    w.add_ssm_group_count(spec.ssm_n_group)
    w.add_full_attention_interval(spec.full_attention_interval)
    if ARCHITECTURES[spec.arch].text_mrope:  # Qwen3.5's; Qwen3-Next's rope is plain
        w.add_rope_dimension_sections([t, h, n - t - h, 0])


class _Tensors:
    """Adds a tiny file's random tensors: matrices in the spec's types, norms near 1."""

    def __init__(self, w: GGUFWriter, spec: TinySpec, rng: np.random.Generator):
        self.w, self.spec, self.rng = w, spec, rng

    def matrix(self, name: str, shape: tuple[int, ...], type_name: str | None = None, scale: float = 0.06) -> None:
        """A 2-D weight, or a 3-D expert tensor (encoded as its rows, then given back its experts)."""
        type_name = type_name or self.spec.weight_type
        type_name = next((t for end, t in self.spec.type_overrides if name.endswith(end)), type_name)
        values = self.rng.standard_normal(shape).astype(np.float32) * scale
        data, qtype = encode_tensor(self.rng, values.reshape(-1, shape[-1]), type_name)
        data = data.reshape(*shape[:-1], data.shape[-1])
        self.w.add_tensor(name, data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)

    def vector(self, name: str, values: np.ndarray) -> None:
        self.w.add_tensor(name, np.asarray(values, np.float32))

    def norm(self, name: str, shape: tuple[int, ...]) -> None:
        self.vector(name, 1.0 + 0.1 * self.rng.standard_normal(shape))


def tiny_config(spec: TinySpec) -> ModelConfig:
    """The ModelConfig labkit will read from the spec's file: its metadata as write_metadata writes
    it, and the optional tensors the family's files carry (ArchTraits.biases, scales, the output)."""
    meta_writer = GGUFWriter(None, spec.arch)  # metadata only, never written
    write_metadata(meta_writer, spec)
    meta = {key: v.value for key, v in meta_writer.kv_data[0].items()}
    traits = ARCHITECTURES[spec.arch]
    names = {f"blk.0.{matrix}.bias" for matrix in traits.biases}
    names |= {"blk.0.attn_q.scale"} if traits.scale_tensors and spec.weight_scales else set()
    names |= set() if spec.tied else {"output.weight"}
    names |= {"blk.0.exp_probs_b.bias"} if traits.expert_selection_bias else set()
    names |= {"rope_freqs.weight"} if spec.rope_freq_factors else set()
    return config_from_metadata(meta, names)


def _write_tensors(w: GGUFWriter, spec: TinySpec, rng: np.random.Generator) -> None:
    """Random values for every tensor the family's graph reads (labkit.model.file_tensors), in the
    order its stages first read them: no tensor list per architecture."""
    t = _Tensors(w, spec, rng)
    known = spec if spec.arch in ARCHITECTURES else replace(spec, arch="llama")  # a family labkit refuses: llama's
    for ft in file_tensors(tiny_config(known)):
        _VALUES[ft.kind](t, ft)


def _matrix(t: _Tensors, ft: FileTensor) -> None:
    scale = 0.05 if ft.name == "output.weight" else 0.04 if "ffn_down" in ft.name else 0.06
    t.matrix(ft.name, ft.shape, scale=scale)


def _bias(t: _Tensors, ft: FileTensor) -> None:
    # a router's bias moves its choices (a selection bias, beside probabilities near 1/n_expert, too);
    # q/k/v biases are qwen2's size
    if ft.name.endswith("ssm_dt.bias"):  # Mamba-2's: softplus(bias) a step in [0.001, 0.1], as it is initialised
        t.vector(ft.name, np.log(np.expm1(t.rng.uniform(1e-3, 0.1, ft.shape))))
        return
    scale = 0.5 if "ffn_gate_inp" in ft.name else 0.1 if ft.name.endswith(("q.bias", "k.bias", "v.bias")) else 0.05
    t.vector(ft.name, scale * t.rng.standard_normal(ft.shape))


# by FileTensor.kind: matrices in the spec's types, norms near 1, a router kept in F32 (as llama.cpp's
# quantizer keeps it) with logits of std ~1 so probabilities spread over the experts as a trained
# router's do, a per-tensor scale in [0.5, 2], a sink logit per head
_VALUES = {
    "embedding": lambda t, ft: t.matrix(ft.name, ft.shape, t.spec.embed_type, 0.5),
    "matrix": _matrix,
    "experts": _matrix,
    "router": lambda t, ft: t.vector(ft.name, t.rng.standard_normal(ft.shape) / np.sqrt(ft.shape[1])),
    "norm": lambda t, ft: t.norm(ft.name, ft.shape),
    "bias": _bias,
    "scale": lambda t, ft: t.vector(ft.name, [t.rng.uniform(0.5, 2.0)]),
    "sinks": lambda t, ft: t.vector(ft.name, 1.5 * t.rng.standard_normal(ft.shape)),
    "freq_factors": lambda t, ft: t.vector(ft.name, llama3_freq_factors(ft.shape[0], 1e4)),
    # Mamba-2's, as its initialisation draws them: conv taps of std ~1/sqrt(d_conv), A = -exp(A_log) with
    # A in [1, 16], D near 1 (f32, as llama.cpp's ggml_ssm_conv and ggml_ssm_scan read them)
    "conv": lambda t, ft: t.vector(ft.name, t.rng.standard_normal(ft.shape) / np.sqrt(ft.shape[1])),
    "ssm_a": lambda t, ft: t.vector(ft.name, -t.rng.uniform(1.0, 16.0, ft.shape)),
    "ssm_d": lambda t, ft: t.vector(ft.name, 1.0 + 0.1 * t.rng.standard_normal(ft.shape)),
}


def llama3_freq_factors(n_pairs: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                        n_ctx_orig: int = 64) -> np.ndarray:  # fmt: skip
    """Meta's llama3 RoPE scaling as the converter writes it into rope_freqs.weight: 1 for the fast
    pairs, `factor` for the slow ones, a smooth ramp between (n_ctx_orig small, so that a tiny model's
    pairs fall on all three parts)."""
    freqs = base ** (-np.arange(n_pairs) * 2.0 / (2 * n_pairs))
    wavelen = 2 * np.pi / freqs
    smooth = (n_ctx_orig / wavelen - low) / (high - low)
    ramp = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < n_ctx_orig / high, 1.0, np.where(wavelen > n_ctx_orig / low, factor, ramp))
