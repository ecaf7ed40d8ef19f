"""Random-weight GGUF files with the public shapes of the models people debug (0.5B to 8B).

No hub can be reached here, so labkit writes its own: real widths, real vocabularies, the
tensor types llama.cpp's Q4_K_M gives (Q4_K; Q6_K for attn_v, ffn_down and the output; Q5_0
and Q8_0 where a row is not a whole number of 256-value blocks, as llama.cpp falls back), and
random blocks whose scales are set so each weight has a standard deviation of about
`GAIN / sqrt(n_cols)`: activations stay in range through every layer, as in a trained model.
Tests write 2 layers (CI stays fast); benchmarks write them all. The file is written tensor
by tensor, so an 8B file (4.8 GB) never sits in memory. Never commit one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from labkit.model.file_tensors import file_tensors
from labkit.model.tiny import TinySpec, tiny_config, write_metadata
from labkit.quant.formats import QUANT_FORMATS
from labkit.quant.random_blocks import unit_std

Q = GGMLQuantizationType
GAIN = 0.7  # weight std × sqrt(n_cols): a little under 1, so 32 random layers neither blow up nor die
# byte offset of each f16 scale in a block; a K-quant's second field is its dmin
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}  # llama.cpp's, for rows not a multiple of 256


@dataclass(frozen=True)
class Shape:
    """A model's public shape: what labkit needs to write a file of it."""

    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    tied: bool
    context: int = 4096
    n_expert: int = 0  # a mixture of experts (qwen3moe): experts per layer, per token, one's width
    n_expert_used: int = 0
    d_ff_expert: int = 0
    sliding_window: int = 0  # gpt-oss: its even layers' window
    d_ff_shexp: int = 0  # shared experts' width (granitehybrid)
    # granitehybrid: each layer's mixer ("M" Mamba-2, "A" attention) and the Mamba-2 sizes
    layer_pattern: str = ""
    ssm_d_state: int = 128
    ssm_head_dim: int = 64
    ssm_n_group: int = 1
    # qwen35, qwen35moe: the gated delta net's value heads (its key heads ssm_n_group of ssm_d_state), and every
    # full_attention_interval-th layer attends
    ssm_n_v_heads: int = 0
    full_attention_interval: int = 4
    # deepseek2: the latent attention's (q_lora, kv_lora, rope, v_head) (head_dim is a key's nope + rope), leading
    # dense layers, expert groups (count, used), the routed scale, the gating function (1 softmax, 2 sigmoid),
    # YaRN (factor, original context, mscale_all_dim)
    mla: tuple[int, int, int, int] = ()
    n_dense_lead: int = 0
    expert_groups: tuple[int, int] = (0, 0)
    expert_weights_scale: float = 1.0
    expert_gating_func: int = 2
    yarn: tuple[float, int, float] = ()


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 14, 2, 64, 4864, 151936, tied=True),
    "llama-3.2-1b": Shape("llama", 16, 2048, 32, 8, 64, 8192, 128256, tied=True),
    "llama-3.2-3b": Shape("llama", 28, 3072, 24, 8, 128, 8192, 128256, tied=True),
    "llama-3.1-8b": Shape("llama", 32, 4096, 32, 8, 128, 14336, 128256, tied=False),
    "qwen3-30b-a3b": Shape(
        "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, tied=False, n_expert=128, n_expert_used=8, d_ff_expert=768
    ),  # fmt: skip
    # gpt-oss-20b: 2880 wide (not a whole number of 256-value blocks), 64 heads of 64, 32 experts of 2880
    "gpt-oss-20b": Shape(
        "gpt-oss",
        24,
        2880,
        64,
        8,
        64,
        2880,
        201088,
        tied=False,
        n_expert=32,
        n_expert_used=4,
        d_ff_expert=2880,
        sliding_window=128,
    ),  # fmt: skip
    # Granite-4.0-H-Tiny (7B, 1B active), its config as published: 40 layers of 1536, attention (12 heads of
    # 128, 4 KV heads, no rope) at layers 5, 15, 25 and 35, Mamba-2 elsewhere (48 heads of 64, state 128, one
    # group), every FFN 64 experts of 512 (6 per token) and a shared one of 1024, a tied 100k vocabulary
    "granite-4.0-h-tiny": Shape(
        "granitehybrid",
        40,
        1536,
        12,
        4,
        128,
        512,
        100352,
        tied=True,
        n_expert=64,
        n_expert_used=6,
        d_ff_expert=512,
        d_ff_shexp=1024,
        layer_pattern="".join("A" if L % 10 == 5 else "M" for L in range(40)),
    ),  # fmt: skip
}
# Qwen3.5 as published (the models' config.json: text_config): heads of 256 with a quarter rotated, gated delta
# nets of 16 key heads and 32 value heads of 128 with every 4th layer attending, a 248k vocabulary. Qwen3.5-4B:
# 32 layers of 2560, 16 query and 4 KV heads, an FFN of 9216, tied; Qwen3.5-9B: 32 layers of 4096, 16 and 4 heads,
# 12288, untied; Qwen3.5-35B-A3B (THUDM/slime's launch script): 40 layers of 2048, 16 and 2 heads, untied
_QWEN35 = {"ssm_d_state": 128, "ssm_n_group": 16, "ssm_n_v_heads": 32}
SHAPES["qwen3.5-4b"] = Shape("qwen35", 32, 2560, 16, 4, 256, 9216, 248320, tied=True, **_QWEN35)
SHAPES["qwen3.5-9b"] = Shape("qwen35", 32, 4096, 16, 4, 256, 12288, 248320, tied=False, **_QWEN35)
SHAPES["qwen3.5-35b-a3b"] = Shape(
    "qwen35moe", 40, 2048, 16, 2, 256, 0, 248320, tied=False, n_expert=256, n_expert_used=8, d_ff_expert=512,
    d_ff_shexp=512, **_QWEN35,
)  # fmt: skip
# Qwen3-Next-80B-A3B as published (THUDM/slime's launch script; its delta nets Qwen3.5's 16 key and 32 value
# heads of 128): 48 layers of 2048, 512 experts of 512 (10 per token) beside a gated shared one, a 152k vocabulary
SHAPES["qwen3-next-80b-a3b"] = Shape(
    "qwen3next", 48, 2048, 16, 2, 256, 0, 151936, tied=False, n_expert=512, n_expert_used=10, d_ff_expert=512,
    d_ff_shexp=512, **_QWEN35,
)  # fmt: skip
# DeepSeek's as published (config.json): heads of 128 unrotated + 64 rotated values, values of 128, a latent of 512.
# V2-Lite: 27 layers of 2048 (no low-rank query: llama.cpp reads 26 or 27 layers as "lite"), 16 heads, 64 experts of
# 1408 (6 a token, softmax) beside 2 shared, 1 dense layer of 10944. V3 (and R1): 61 layers of 7168, 128 heads, a
# query of rank 1536, 256 experts of 2048 (8 a token from 4 of 8 groups, sigmoid, x2.5) beside 1 shared, 3 dense
# layers of 18432. Kimi K2: V3's widths with 64 heads, 384 experts, no groups, x2.827, 1 dense layer, a 164k vocabulary
_DEEPSEEK = {"head_dim": 192, "tied": False, "d_ff_expert": 2048, "context": 163840}
SHAPES["deepseek-v2-lite"] = Shape(
    "deepseek2", 27, 2048, 16, 16, d_ff=10944, vocab=102400, n_expert=64, n_expert_used=6, d_ff_shexp=2 * 1408,
    mla=(0, 512, 64, 128), n_dense_lead=1, expert_gating_func=1, yarn=(40.0, 4096, 0.707),
    **{**_DEEPSEEK, "d_ff_expert": 1408},
)  # fmt: skip
SHAPES["deepseek-v3"] = Shape(
    "deepseek2", 61, 7168, 128, 128, d_ff=18432, vocab=129280, n_expert=256, n_expert_used=8, d_ff_shexp=2048,
    mla=(1536, 512, 64, 128), n_dense_lead=3, expert_groups=(8, 4), expert_weights_scale=2.5, yarn=(40.0, 4096, 1.0),
    **_DEEPSEEK,
)  # fmt: skip
SHAPES["kimi-k2"] = Shape(
    "deepseek2", 61, 7168, 64, 64, d_ff=18432, vocab=163840, n_expert=384, n_expert_used=8, d_ff_shexp=2048,
    mla=(1536, 512, 64, 128), n_dense_lead=1, expert_weights_scale=2.827, yarn=(32.0, 4096, 1.0),
    **{**_DEEPSEEK, "context": 131072},
)  # fmt: skip
MOE_BODY = {"ffn_gate_exps": Q.Q4_K, "ffn_up_exps": Q.Q4_K, "ffn_down_exps": Q.Q6_K}  # the router stays F32
# llama.cpp's MXFP4_MOE, as OpenAI ships gpt-oss: MXFP4 experts, Q8_0 for every other matrix
MXFP4_MOE = {n: Q.Q8_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output")} | dict.fromkeys(MOE_BODY, Q.MXFP4)


def tensor_types(shape: Shape, mix: str = "Q4_K_M") -> dict[str, GGMLQuantizationType]:
    """Q4_K_M as llama.cpp assigns it: Q6_K for attn_v, ffn_down and the output (the tied embedding
    when there is no output.weight), Q4_K for the other matrices. Any other `mix` names one GGUF
    type (Q2_K, IQ4_XS, TQ2_0, ...) for every layer matrix, the output kept in Q6_K as llama.cpp
    keeps it: the Q4_K_M file's twin in that type."""
    body = {n: Q.Q4_K for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up", "ssm_in", "ssm_out",
                                "attn_qkv", "attn_gate")}  # fmt: skip
    body |= {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}
    if shape.mla:  # DeepSeek's attention; the per-head k_b and v_b (rows of 128 and 512) in Q8_0
        body = {n: t for n, t in body.items() if not n.startswith("attn_")} | {
            "attn_q": Q.Q4_K, "attn_q_a": Q.Q4_K, "attn_q_b": Q.Q4_K, "attn_kv_a_mqa": Q.Q4_K, "attn_k_b": Q.Q8_0,
            "attn_v_b": Q.Q8_0, "attn_output": Q.Q4_K}  # fmt: skip
    if shape.n_expert and not shape.n_dense_lead:
        body = {n: t for n, t in body.items() if not n.startswith("ffn_")} | MOE_BODY
    elif shape.n_expert:  # leading dense layers keep their FFN's types beside the experts'
        body |= MOE_BODY
    if shape.d_ff_shexp:
        body |= {"ffn_gate_shexp": Q.Q4_K, "ffn_up_shexp": Q.Q4_K, "ffn_down_shexp": Q.Q6_K}
    if mix == "MXFP4_MOE":
        body = dict(MXFP4_MOE)
    elif mix != "Q4_K_M":
        body = dict.fromkeys(body, Q[mix])
    types = {"token_embd.weight": Q.Q6_K if shape.tied else body["attn_q"]}
    if not shape.tied:
        types["output.weight"] = Q.Q8_0 if mix == "MXFP4_MOE" else Q.Q6_K
    for L in range(shape.n_layers):
        types |= {f"blk.{L}.{n}.weight": t for n, t in body.items()}
    return types


def tensor_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """Every tensor of the architecture, in numpy order ([rows, cols]; a vector is [n]; experts
    [n_expert, rows, cols]): what its stage graph reads (labkit.model.file_tensors)."""
    return {ft.name: ft.shape for ft in file_tensors(tiny_config(shape_spec(shape)))}


def tensor_kinds(shape: Shape) -> dict[str, str]:
    """Each tensor's kind (labkit.model.file_tensors.FileTensor.kind): what its random values are."""
    return {ft.name: ft.kind for ft in file_tensors(tiny_config(shape_spec(shape)))}


def shape_spec(shape: Shape) -> TinySpec:
    """The shape as the tiny writer's spec: its metadata and its config come from the same code."""
    return TinySpec(arch=shape.arch, weight_type="Q4_K", n_layers=shape.n_layers, d_model=shape.d_model,
                    n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, d_ff=shape.d_ff,
                    vocab=shape.vocab, context=shape.context, tied=shape.tied, n_expert=shape.n_expert,
                    n_expert_used=shape.n_expert_used, d_ff_expert=shape.d_ff_expert,
                    sliding_window=shape.sliding_window or 4096, weight_scales=False, d_ff_shexp=shape.d_ff_shexp,
                    layer_pattern=shape.layer_pattern, ssm_d_state=shape.ssm_d_state,
                    ssm_head_dim=shape.ssm_head_dim, ssm_n_group=shape.ssm_n_group, ssm_n_v_heads=shape.ssm_n_v_heads,
                    full_attention_interval=shape.full_attention_interval, **_mla_spec(shape))  # fmt: skip


def _mla_spec(shape: Shape) -> dict:
    """A DeepSeek shape's TinySpec fields (none for another family)."""
    if not shape.mla:
        return {}
    q_lora, kv_lora, rope, v_head = shape.mla
    factor, n_ctx_orig, mscale_all_dim = shape.yarn
    return {"mla_q_lora": q_lora, "mla_kv_lora": kv_lora, "mla_rope": rope, "mla_v_head": v_head,
            "n_dense_lead": shape.n_dense_lead, "expert_groups": shape.expert_groups,
            "expert_weights_scale": shape.expert_weights_scale, "expert_gating_func": shape.expert_gating_func,
            "rope_scaling": ("yarn", factor, n_ctx_orig), "yarn_log_mul": 0.1 * mscale_all_dim}  # fmt: skip


def storage_type(qtype: GGMLQuantizationType, n_cols: int) -> GGMLQuantizationType:
    """The type a row of n_cols values is stored in: llama.cpp's fallback when blocks do not fit."""
    block = GGML_QUANT_SIZES[qtype][0]
    return _FALLBACK.get(qtype, Q.Q8_0) if n_cols % block else qtype


def random_blocks(rng: np.random.Generator, qtype: GGMLQuantizationType, n_blocks: int, scale: float) -> np.ndarray:
    """n_blocks random valid blocks of qtype, each block's scale in [0.5, 1] × scale (its record's
    writer: a K-quant's min set to cancel its mean)."""
    return QUANT_FORMATS[qtype].random_blocks(rng, n_blocks, scale)


def write_shaped_model(
    path: str | Path, shape: Shape | str, n_layers: int | None = None, seed: int = 0, mix: str = "Q4_K_M"
) -> Path:
    """Write a random-weight file of `shape` (a Shape or a SHAPES name), `n_layers` of its layers
    (all by default), its matrices typed by `mix` (tensor_types); returns the path. Written tensor
    by tensor: memory stays at one tensor."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    n = n_layers or shape.n_layers
    shape = replace(shape, n_layers=n, layer_pattern=shape.layer_pattern[:n])  # a hybrid's first n layers
    path = Path(path)
    rng = np.random.default_rng(seed)
    types, shapes, kinds = tensor_types(shape, mix), tensor_shapes(shape), tensor_kinds(shape)
    w = GGUFWriter(str(path), shape.arch)
    spec = shape_spec(shape)
    write_metadata(w, spec, name=f"labkit shaped d{shape.d_model} x{shape.n_layers}", merges=["<t1> <t2>"])
    stored = {}
    for name, shp in shapes.items():
        if name not in types:  # vectors, and a router kept in F32
            w.add_tensor_info(name, shp, np.dtype(np.float32), 4 * int(np.prod(shp)))
            continue
        qt = storage_type(types[name], shp[-1])
        block, size = GGML_QUANT_SIZES[qt]
        stored[name] = qt
        nbytes = int(np.prod(shp[:-1])) * (shp[-1] // block * size)
        w.add_tensor_info(name, (*shp[:-1], shp[-1] // block * size), np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    units = {qt: unit_std(QUANT_FORMATS[qt], rng) for qt in set(stored.values())}
    for name, shp in shapes.items():
        w.write_tensor_data(_tensor(rng, name, shp, stored.get(name), units, kinds[name]))
    w.close()
    return path


def _tensor(rng: np.random.Generator, name: str, shp: tuple, qt, units: dict, kind: str = "") -> np.ndarray:
    if qt is None and kind in _MIXER_VALUES or name.endswith("ssm_dt.bias"):  # Mamba-2's, as initialised
        return _MIXER_VALUES["dt_bias" if name.endswith("ssm_dt.bias") else kind](rng, shp).astype(np.float32)
    if qt is None and kind == "norm":  # norm weights near 1 (Mamba-2's grouped one is 2-D)
        return (1.0 + 0.1 * rng.standard_normal(shp)).astype(np.float32)
    if qt is None and name.endswith(".bias"):  # biases near 0 (a router's, an expert's)
        return (0.1 * rng.standard_normal(shp)).astype(np.float32)
    if qt is None and len(shp) == 2:  # a router: logits of std ~1, probabilities spread over the experts
        return (rng.standard_normal(shp) / np.sqrt(shp[1])).astype(np.float32)
    if qt is None:  # norm weights near 1, biases near 0
        base = 0.0 if name.endswith(".bias") else 1.0
        return (base + 0.1 * rng.standard_normal(shp[0])).astype(np.float32)
    rows, cols = int(np.prod(shp[:-1])), shp[-1]
    block, size = GGML_QUANT_SIZES[qt]
    scale = GAIN / np.sqrt(cols) / units[qt]
    if name == "token_embd.weight":
        scale = 1.0 / units[qt]  # embeddings of about unit size, as trained models have
    return random_blocks(rng, qt, rows * cols // block, scale).reshape(*shp[:-1], cols // block * size)


# Mamba-2's f32 tensors as its initialisation draws them (labkit.model.tiny's, for files written in parts):
# conv taps of std 1/sqrt(d_conv), A = -exp(A_log) in [-16, -1], D near 1, dt's bias a step in [0.001, 0.1]
_MIXER_VALUES = {
    "conv": lambda rng, shp: rng.standard_normal(shp) / np.sqrt(shp[-1]),
    "ssm_a": lambda rng, shp: -rng.uniform(1.0, 16.0, shp),
    "ssm_d": lambda rng, shp: 1.0 + 0.1 * rng.standard_normal(shp),
    "dt_bias": lambda rng, shp: np.log(np.expm1(rng.uniform(1e-3, 0.1, shp))),
}
