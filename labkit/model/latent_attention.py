"""DeepSeek's multi-head latent attention (MLA) as numbers: the sizes a deepseek2 file gives, read
as llama.cpp's deepseek2 load_arch_hparams reads them, and the softmax scale its graph computes.

Each token's keys and values are one compressed latent of `kv_lora` values (normed) plus one
rotary key of `rope` values shared by every head; each head's query has a `nope` part, which meets
the latent through that head's slice of `attn_k_b`, and a `rope` part, which meets the rotary key.
The cache holds the latent and the rotary key, `kv_lora + rope` values a token, where a
multi-head cache would hold `n_heads * (nope + rope + v_head)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.errors import HyperparameterError, UnsupportedArchitectureError
from labkit.model.metadata_values import meta_count, meta_finite
from labkit.ops.attn_scores import attention_mask
from labkit.ops.softmax import softmax


@dataclass(frozen=True)
class MlaShape:
    """A latent attention's sizes (llama.cpp's n_lora_q, n_lora_kv, n_embd_head_k_mla, n_rot, ...)."""

    q_lora: int  # the query's low rank (attn_q_a, attn_q_a_norm, attn_q_b); 0: one attn_q (the "lite" models)
    kv_lora: int  # the latent's width
    nope: int  # each head's query and key values without rotation
    rope: int  # each head's rotated query values, and the rotary key's (shared by the heads)
    v_head: int  # each head's value width, after attn_v_b
    kq_scale: float  # the softmax scale: YaRN's mscale squared over sqrt(nope + rope)

    @property
    def k_head(self) -> int:
        """A head's key (and query) width in the multi-head form: nope + rope."""
        return self.nope + self.rope

    @property
    def cached(self) -> int:
        """What the cache holds a token: the normed latent, then the rotated key."""
        return self.kv_lora + self.rope


def is_lite(n_layers: int, n_vocab: int) -> bool:
    """llama.cpp's test for a model without a low-rank query (DeepSeek-V2-Lite and kin): its layer count."""
    return n_layers in (26, 27) or (n_layers == 48 and n_vocab == 128256)


def mla_head(meta: dict[str, Any], p: str) -> int:
    """A head's key width in the multi-head form (key_length_mla); a legacy file without it is refused."""
    if p + "attention.key_length_mla" not in meta:
        raise UnsupportedArchitectureError(
            f"this {p[:-1]} file has no {p}attention.key_length_mla: a legacy file with one attn_kv_b per layer, "
            "which labkit does not read (re-convert it: current converters split attn_k_b and attn_v_b)"
        )
    return meta_count(meta, p + "attention.key_length_mla")


def mla_shape(meta: dict[str, Any], p: str, n_layers: int, n_vocab: int, rope_dim: int, scaling) -> MlaShape:
    """The sizes, checked: the split attn_k_b / attn_v_b form only (a file without key_length_mla has
    the legacy attn_kv_b, refused); `scaling` is the file's RopeScaling."""
    kv_lora = meta_count(meta, p + "attention.kv_lora_rank")
    k_head = mla_head(meta, p)
    v_head = meta_count(meta, p + "attention.value_length_mla")
    if rope_dim >= k_head:
        raise HyperparameterError(
            f"{p}rope.dimension_count {rope_dim} leaves no unrotated part of the {k_head}-wide key "
            f"({p}attention.key_length_mla): llama.cpp asserts at least 1"
        )
    for key, want in (("key_length", kv_lora + rope_dim), ("value_length", kv_lora)):
        got = meta_count(meta, p + "attention." + key, want)
        if got != want:
            raise HyperparameterError(
                f"{p}attention.{key} is {got}; an MLA file's is {want} (the latent's {kv_lora} values"
                + (f" plus the rotary key's {rope_dim})" if key == "key_length" else ")")
            )
    q_lora = 0 if is_lite(n_layers, n_vocab) else meta_count(meta, p + "attention.q_lora_rank")
    return MlaShape(q_lora, kv_lora, k_head - rope_dim, rope_dim, v_head, kq_scale(meta, p, k_head, scaling))


def kq_scale(meta: dict[str, Any], p: str, k_head: int, scaling) -> float:
    """llama.cpp's deepseek2 graph: the rope's attention factor with YaRN's own term cancelled, times
    YaRN's mscale for the file's log multiplier (stored x0.1), squared, over sqrt(key width)."""
    log_mul = meta_finite(meta, p + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1
    inv = 1.0 / scaling.freq_scale
    mscale = scaling.attn_factor * (1.0 + 0.1 * math.log(inv)) * (1.0 + 0.1 * log_mul * math.log(inv))
    return mscale * mscale / math.sqrt(k_head)


def mla_rope_attn_factor(meta: dict[str, Any], p: str, scaling) -> float:
    """The rotation's attention factor llama.cpp gives deepseek2 under YaRN: with a log multiplier,
    get_mscale(f, m) / get_mscale(f, m) = 1 (mscale is set to the multiplier), then YaRN's own term
    cancelled; the file's rope.scaling.attn_factor kept."""
    if not scaling.ext_factor or p + "rope.scaling.yarn_log_multiplier" not in meta:
        return scaling.attn_factor
    f = 1.0 / scaling.freq_scale
    file_factor = float(meta.get(p + "rope.scaling.attn_factor", 1.0))
    return file_factor / (1.0 + 0.1 * math.log(f))


def naive_attention(captures, weight, cfg, layer: int) -> dict[str, np.ndarray]:
    """The multi-head form of one layer's attention from a one-pass run's captures, in float64: each
    head's key is [W_kb[h]ᵀ·c ; k_pe] and its value W_vb[h]·c, up-projected from the cached latent c,
    then ordinary attention. Absorption (what labkit and llama.cpp run) is exact algebra: its scores and
    context must equal these to rounding. Returns attn_scores ([heads, T, T]) and attn_ctx ([T, heads·v_head])."""
    m, H, p = cfg.mla, cfg.n_heads, f"blk.{layer}."
    c, k_pe = captures[p + "kv_latent_norm"], captures[p + "k_pe_rope"]
    T = c.shape[0]
    wkb = weight(p + "attn_k_b.weight").reshape(H, m.kv_lora, m.nope)
    wvb = weight(p + "attn_v_b.weight").reshape(H, m.v_head, m.kv_lora)
    k_nope = np.einsum("sc,hcn->hsn", c, wkb)  # each head's unrotated keys, up-projected
    values = np.einsum("sc,hvc->hsv", c, wvb)
    q_nope = captures[p + "q_nope"].reshape(T, H, m.nope).transpose(1, 0, 2)
    q_pe = captures[p + "q_pe_rope"].reshape(T, H, m.rope).transpose(1, 0, 2)
    raw = np.einsum("htn,hsn->hts", q_nope, k_nope) + np.einsum("htr,sr->hts", q_pe, k_pe)
    scores = np.where(attention_mask(T, 0, None)[None], raw * m.kq_scale, -np.inf)
    ctx = np.einsum("hts,hsv->thv", softmax(scores), values).reshape(T, H * m.v_head)
    return {"attn_scores": scores, "attn_ctx": ctx}
