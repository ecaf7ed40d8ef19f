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


def with_cache_stages(graph: list[Stage], cfg: ModelConfig, types: CacheTypes) -> list[Stage]:
    """The graph with a `<kind>_cache` stage after each writer of a cache whose type is not f32."""
    if types == CacheTypes():
        return graph
    for kind, width in zip(("k", "v"), cfg.cache_dims):
        if types.of(kind) != "f32":
            check_width(types.of(kind), width, kind)
    out: list[Stage] = []
    renamed: dict[tuple[int | None, str], str] = {}  # (layer, writer) -> its cache stage
    for st in graph:
        if st.kv_read:
            st = replace(st, inputs=tuple(renamed.get((st.layer, i), i) for i in st.inputs))
        kind = st.kv_write
        if kind is None or types.of(kind) == "f32":
            out.append(st)
            continue
        name = f"blk.{st.layer}.{kind}_cache"
        width = cfg.cache_dims[kind == "v"]
        out.append(replace(st, kv_write=None))
        out.append(Stage(name, "kv_cache", (st.name,), params={"type": types.of(kind), "width": width},
                         layer=st.layer, kv_write=kind))  # fmt: skip
        renamed[(st.layer, st.name)] = name
    return out
