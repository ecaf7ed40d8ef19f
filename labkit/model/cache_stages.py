"""A model's graph with its KV cache in a smaller type: a stage after each cache writer.

`labkit.open(m, kv_type="q8_0")` (or `kv_type_k`, `kv_type_v`) stores K and V as llama.cpp's
`--cache-type-k/-v` do. Each stage that wrote the cache (`k_rope`, `v`, DeepSeek's `k_mla`, ...) keeps
its value and hands the cache role to a new stage, `blk.L.k_cache` or `blk.L.v_cache` (op kv_cache): the
rows as the cache holds them. The stages that read the cache name it as their input, so what they read
is one captured stage, in both engines and in the attribution.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from labkit.model.config import ModelConfig
from labkit.model.graph import Stage
from labkit.quant.cache_types import check_kv_type, check_width


@dataclass(frozen=True)
class CacheTypes:
    """The K cache's and the V cache's type (labkit.quant.cache_types.KV_TYPES)."""

    k: str = "f32"
    v: str = "f32"

    def of(self, kind: str) -> str:
        return self.k if kind == "k" else self.v

    def __str__(self) -> str:
        return self.k if self.k == self.v else f"K {self.k}, V {self.v}"


def cache_types(kv_type: str | None = None, kv_type_k: str | None = None, kv_type_v: str | None = None) -> CacheTypes:
    """The types asked for: `kv_type` for both, `kv_type_k`/`kv_type_v` for one (f32 where none is given)."""
    both = check_kv_type(kv_type) if kv_type is not None else "f32"
    k = check_kv_type(kv_type_k, "kv_type_k") if kv_type_k is not None else both
    v = check_kv_type(kv_type_v, "kv_type_v") if kv_type_v is not None else both
    return CacheTypes(k, v)


def stored_types(graph: list[Stage]) -> dict[str, str]:
    """{"k"/"v": type} of the caches a graph stores in a smaller type (none for an f32 cache)."""
    return {st.kv_write: st.params["type"] for st in graph if st.kv_write and "type" in st.params}


def rotation_sizes(cfg: ModelConfig, types: CacheTypes) -> dict[str, int]:
    """{"k"/"v": n} of the Walsh-Hadamard rotations llama.cpp applies before a quantized cache (llama.cpp
    #21038; llama_kv_cache's attn_rot_k/v): for a quantized type (not f16 or bf16) when every attending layer's
    heads are one width, a multiple of 64. K's (and the queries') blocks are the largest power of two from 64
    dividing the head, V's 64. DeepSeek's latent cache is left unrotated here."""
    if cfg.mla is not None or cfg.head_dim % 64:
        return {}
    n_k = 64
    while cfg.head_dim % (2 * n_k) == 0:
        n_k *= 2
    sizes = {"k": n_k, "v": 64}
    return {kind: n for kind, n in sizes.items() if types.of(kind) not in ("f32", "f16", "bf16")}


def with_cache_stages(graph: list[Stage], cfg: ModelConfig, types: CacheTypes) -> list[Stage]:
    """The graph with a `<kind>_cache` stage after each writer of a cache whose type is not f32, and llama.cpp's
    rotations around a quantized cache (`rotation_sizes`): `q_rot` and `k_rot` before the scores, `v_rot` before
    the V cache; the attention then mixes rotated values, so its output is `attn_ctx_rot` and a stage turning it
    back keeps the name `attn_ctx` (the context every cache type computes, comparable across them)."""
    if types == CacheTypes():
        return graph
    for kind, width in zip(("k", "v"), cfg.cache_dims):
        if types.of(kind) != "f32":
            check_width(types.of(kind), width, kind)
    rot = rotation_sizes(cfg, types)
    queries = {st.inputs[0] for st in graph if st.op == "attn_scores"} if "k" in rot else set()
    out: list[Stage] = []
    stands_for: dict[str, str] = {}  # in the attention's reads: a writer's cache stage, the rotated queries
    for st in graph:
        if st.kv_read:
            st = replace(st, inputs=tuple(stands_for.get(i, i) for i in st.inputs))
        if st.op == "attn_ctx" and "v" in rot:  # the context of rotated values, then turned back
            turned = replace(st, name=f"blk.{st.layer}.attn_ctx_rot")
            out.append(turned)
            out.append(Stage(st.name, "hadamard", (turned.name,), params={"n": rot["v"], "width": cfg.q_dim},
                             layer=st.layer))  # fmt: skip
            continue
        kind = st.kv_write if st.kv_write and types.of(st.kv_write) != "f32" else None
        out.append(replace(st, kv_write=None) if kind else st)
        last = st.name
        if kind in rot or st.name in queries:
            what = kind or "q"
            last = _add(out, st, f"{what}_rot", "hadamard", {"n": rot["v" if what == "v" else "k"],
                                                             "width": _width(cfg, what)})  # fmt: skip
        if kind:
            cache = {"type": types.of(kind), "width": cfg.cache_dims[kind == "v"]}
            last = _add(out, st, f"{kind}_cache", "kv_cache", cache, kv_write=kind, source=last)
        if last != st.name:
            stands_for[st.name] = last
    return out


def _width(cfg: ModelConfig, what: str) -> int:
    return cfg.kv_dim if what in ("k", "v") else cfg.q_dim


def _add(out: list[Stage], after: Stage, kind: str, op: str, params: dict, kv_write: str | None = None,
         source: str | None = None) -> str:  # fmt: skip
    """A stage of `after`'s layer reading `source` (default: `after`), appended; its name."""
    name = f"blk.{after.layer}.{kind}"
    out.append(Stage(name, op, (source or after.name,), params=params, layer=after.layer, kv_write=kv_write))
    return name
