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
    # gpt-oss's parts at tiny size: MXFP4 experts (as OpenAI ships them), a sink per head, even layers
    # with a window shorter than a test prompt, biases on attention, router and experts
    "tiny-gpt-oss": TinySpec(
        arch="gpt-oss",
        n_layers=4,
        n_expert=16,
        n_expert_used=4,
        d_ff_expert=256,
        tied=False,
        seed=17,
        type_overrides=(("_exps.weight", "MXFP4"),),
    ),  # fmt: skip
}
MOE_ARCHITECTURES = ("qwen3moe", "gpt-oss")


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
    if a == "gpt-oss":  # llama.cpp's own pattern: even layers slide
        w.add_sliding_window(spec.sliding_window)
    if a in MOE_ARCHITECTURES:
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

    def norm(self, name: str, n: int) -> None:
        self.vector(name, 1.0 + 0.1 * self.rng.standard_normal(n))


def _write_tensors(w: GGUFWriter, spec: TinySpec, rng: np.random.Generator) -> None:
    """Random weights under the architecture's tensor names (fused ones for phi3)."""
    t, d = _Tensors(w, spec, rng), spec.d_model
    t.matrix("token_embd.weight", (spec.vocab, d), spec.embed_type, 0.5)
    if not spec.tied and spec.arch not in ("gemma2", "bitnet"):  # llama.cpp never reads their output.weight
        t.matrix("output.weight", (spec.vocab, d), scale=0.05)
    t.norm("output_norm.weight", d)
    for L in range(spec.n_layers):
        _attention_tensors(t, spec, f"blk.{L}.")
        t.norm(f"blk.{L}.{'post_attention_norm' if spec.arch == 'gpt-oss' else 'ffn_norm'}.weight", d)
        (_moe_tensors if spec.arch in MOE_ARCHITECTURES else _ffn_tensors)(t, spec, f"blk.{L}.")


def _attention_tensors(t: _Tensors, spec: TinySpec, p: str) -> None:
    a, d, hd = spec.arch, spec.d_model, spec.head_dim
    qd, kvd = spec.n_heads * hd, spec.n_kv_heads * hd
    t.norm(p + "attn_norm.weight", d)
    if a == "phi3":  # fused: rows q; k; v
        t.matrix(p + "attn_qkv.weight", (qd + 2 * kvd, d))
    else:
        for n, rows in (("q", qd), ("k", kvd), ("v", kvd)):
            t.matrix(p + f"attn_{n}.weight", (rows, d))
    t.matrix(p + "attn_output.weight", (d, qd))
    if a == "bitnet":  # the sub-norms, and each matrix's per-tensor scale
        t.norm(p + "attn_sub_norm.weight", qd)
        t.norm(p + "ffn_sub_norm.weight", spec.d_ff)
        for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            if spec.weight_scales:
                t.vector(p + m + ".scale", [t.rng.uniform(0.5, 2.0)])
    if a in ("qwen2", "gpt-oss"):
        for n, rows in (("q", qd), ("k", kvd), ("v", kvd)):
            t.vector(p + f"attn_{n}.bias", 0.1 * t.rng.standard_normal(rows))
    if a == "gpt-oss":  # the output's bias, and each head's sink logit
        t.vector(p + "attn_output.bias", 0.05 * t.rng.standard_normal(d))
        t.vector(p + "attn_sinks.weight", 1.5 * t.rng.standard_normal(spec.n_heads))
    if a in ("gemma3", "qwen3", "qwen3moe"):
        t.norm(p + "attn_q_norm.weight", hd)
        t.norm(p + "attn_k_norm.weight", hd)
    if a in ("gemma2", "gemma3"):
        t.norm(p + "post_attention_norm.weight", d)
        t.norm(p + "post_ffw_norm.weight", d)


def _ffn_tensors(t: _Tensors, spec: TinySpec, p: str) -> None:
    d, ff = spec.d_model, spec.d_ff
    if spec.arch == "phi3":  # fused: gate rows, then up rows
        t.matrix(p + "ffn_up.weight", (2 * ff, d))
    else:
        t.matrix(p + "ffn_gate.weight", (ff, d))
        t.matrix(p + "ffn_up.weight", (ff, d))
    t.matrix(p + "ffn_down.weight", (d, ff), scale=0.04)


def _moe_tensors(t: _Tensors, spec: TinySpec, p: str) -> None:
    """The router (kept in F32, as llama.cpp's quantizer keeps it; logits of std ~1, so probabilities
    spread over the experts as a trained router's do) and each projection of every expert, 3-D."""
    n, f, d = spec.n_expert, spec.d_ff_expert, spec.d_model
    t.vector(p + "ffn_gate_inp.weight", t.rng.standard_normal((n, d)) / np.sqrt(d))
    t.matrix(p + "ffn_gate_exps.weight", (n, f, d))
    t.matrix(p + "ffn_up_exps.weight", (n, f, d))
    t.matrix(p + "ffn_down_exps.weight", (n, d, f), scale=0.04)
    if spec.arch == "gpt-oss":  # biases on the router and on every expert's projections
        t.vector(p + "ffn_gate_inp.bias", 0.5 * t.rng.standard_normal(n))
        for name, width in (("ffn_gate_exps", f), ("ffn_up_exps", f), ("ffn_down_exps", d)):
            t.vector(p + name + ".bias", 0.05 * t.rng.standard_normal((n, width)))
