"""Tiny synthetic GGUF models written with gguf.GGUFWriter, for fast tests of every path.

Same tensor names and metadata keys as the real files, random weights, and sizes
chosen to exercise the awkward cases: K-quant rows of 256, GQA, a sliding window
shorter than a test prompt (gemma3), q/k/v biases (qwen2), separate or tied heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from labkit.quant.formats import QUANT_FORMATS
from labkit.quant.random_blocks import unit_std

Q = GGMLQuantizationType


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # any of labkit.model.config.SUPPORTED_ARCHITECTURES
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
    sliding_window: int = 4  # gemma2/gemma3 only
    swa_pattern: int = 2  # gemma2/gemma3 only: layers 0, 2, ... local; 1, 3, ... global
    attn_softcap: float = 3.0  # gemma2 only: small, so that the cap bends these tiny models' scores
    final_softcap: float = 10.0  # gemma2 only: bends the tiny logits (about ±20) without ties at the cap
    tied: bool = True
    seed: int = 0
    # (tensor name suffix, type): matrices stored in another type than weight_type, as llama.cpp's
    # presets mix them (("attn_v.weight", "IQ4_XS"), ...)
    type_overrides: tuple[tuple[str, str], ...] = ()
    n_expert: int = 8  # qwen3moe only: experts per layer
    n_expert_used: int = 2  # qwen3moe only: experts per token
    d_ff_expert: int = 256  # qwen3moe only: one expert's width
    weight_scales: bool = True  # bitnet only: a per-tensor `<matrix>.scale` beside each layer matrix


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
    a = spec.arch
    # no architecture in the name: llama.cpp keys vocab fix-ups on it ("phi3" wants a "</s>" token)
    w.add_name(name or f"labkit tiny {spec.weight_type}")
    w.add_block_count(spec.n_layers)
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.d_model)
    w.add_feed_forward_length(spec.d_ff)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6 if a.startswith("gemma") else 1e-5)
    w.add_rope_freq_base(1e6 if a == "gemma3" else 1e4)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_vocab_size(spec.vocab)
    if a in ("gemma2", "gemma3"):
        w.add_sliding_window(spec.sliding_window)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_pattern)
    if a == "qwen3moe":
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.d_ff_expert)
    if a == "gemma2":
        w.add_float32(f"{a}.attn_logit_softcapping", spec.attn_softcap)
        w.add_float32(f"{a}.final_logit_softcapping", spec.final_softcap)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(spec.vocab)])
    w.add_token_types([1] * spec.vocab)
    w.add_token_merges(list(merges))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(a != "llama")


def _write_tensors(w: GGUFWriter, spec: TinySpec, rng: np.random.Generator) -> None:
    """Random weights under the architecture's tensor names (fused ones for phi3)."""
    a = spec.arch

    def tensor(name: str, shape: tuple[int, ...], type_name: str, scale: float) -> None:
        """A 2-D weight, or a 3-D expert tensor (encoded as its rows, then given back its experts)."""
        type_name = next((t for end, t in spec.type_overrides if name.endswith(end)), type_name)
        values = rng.standard_normal(shape).astype(np.float32) * scale
        data, qtype = encode_tensor(rng, values.reshape(-1, shape[-1]), type_name)
        data = data.reshape(*shape[:-1], data.shape[-1])
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    d, hd, wt = spec.d_model, spec.head_dim, spec.weight_type
    qd, kvd = spec.n_heads * hd, spec.n_kv_heads * hd
    tensor("token_embd.weight", (spec.vocab, d), spec.embed_type, 0.5)
    if not spec.tied and a not in ("gemma2", "bitnet"):  # llama.cpp never reads their output.weight
        tensor("output.weight", (spec.vocab, d), wt, 0.05)
    norm("output_norm.weight", d)
    for L in range(spec.n_layers):
        p = f"blk.{L}."
        norm(p + "attn_norm.weight", d)
        if a == "phi3":  # fused: rows q; k; v
            tensor(p + "attn_qkv.weight", (qd + 2 * kvd, d), wt, 0.06)
        else:
            tensor(p + "attn_q.weight", (qd, d), wt, 0.06)
            tensor(p + "attn_k.weight", (kvd, d), wt, 0.06)
            tensor(p + "attn_v.weight", (kvd, d), wt, 0.06)
        tensor(p + "attn_output.weight", (d, qd), wt, 0.06)
        if a == "bitnet":  # the sub-norms, and each matrix's per-tensor scale
            norm(p + "attn_sub_norm.weight", qd)
            norm(p + "ffn_sub_norm.weight", spec.d_ff)
            for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                if spec.weight_scales:
                    w.add_tensor(p + m + ".scale", np.array([rng.uniform(0.5, 2.0)], np.float32))
        if a == "qwen2":
            for n, rows in (
                ("q", spec.n_heads * hd),
                ("k", spec.n_kv_heads * hd),
                ("v", spec.n_kv_heads * hd),
            ):
                w.add_tensor(p + f"attn_{n}.bias", (0.1 * rng.standard_normal(rows)).astype(np.float32))
        if a in ("gemma3", "qwen3", "qwen3moe"):
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        if a in ("gemma2", "gemma3"):
            norm(p + "post_attention_norm.weight", d)
            norm(p + "post_ffw_norm.weight", d)
        norm(p + "ffn_norm.weight", d)
        if a == "qwen3moe":  # the router (kept in F32, as llama.cpp's quantizer keeps it) and the experts
            n, f = spec.n_expert, spec.d_ff_expert
            # router logits of std ~1: probabilities spread over the experts, as a trained router's are
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n, d)) / np.sqrt(d)).astype(np.float32))
            tensor(p + "ffn_gate_exps.weight", (n, f, d), wt, 0.06)
            tensor(p + "ffn_up_exps.weight", (n, f, d), wt, 0.06)
            tensor(p + "ffn_down_exps.weight", (n, d, f), wt, 0.04)
            continue
        if a == "phi3":  # fused: gate rows, then up rows
            tensor(p + "ffn_up.weight", (2 * spec.d_ff, d), wt, 0.06)
        else:
            tensor(p + "ffn_gate.weight", (spec.d_ff, d), wt, 0.06)
            tensor(p + "ffn_up.weight", (spec.d_ff, d), wt, 0.06)
        tensor(p + "ffn_down.weight", (d, spec.d_ff), wt, 0.04)
