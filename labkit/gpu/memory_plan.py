"""The GPU path's share of the memory plan (labkit.model.memory): its weights as the selected
kernels read them (GGUF bytes, or a repacked layout: int8, or blocks near the format's width),
its KV cache, the regions of a pass, and the host copies of the captures. On lavapipe all of it
is host memory."""

from __future__ import annotations

import math

from labkit.model.memory import CAPTURE_HINT, MemoryPart, kv_bytes, kv_detail, peak_live_bytes, stage_bytes, state_part
from labkit.ops import OPS


def weight_bytes(ex) -> tuple[int, str]:
    """Bytes of the weights on the device under the selected kernels, and how they are laid out."""
    from labkit.gpu.repack import layout_of, stored_bytes

    kernels = ex.selection().kernels
    seen: dict[tuple, int] = {}
    layouts: set[str] = set()
    for st in ex.graph:
        kind = OPS[st.op].weight
        if kind == "matrix":
            k = kernels[st.name]
            t = ex.gguf.tensors[st.weight]
            rows = (st.weight_rows[1] - st.weight_rows[0]) if st.weight_rows else t.n_rows
            if k.repack is not None:
                layout = layout_of(k.repack())
                seen[(st.weight, st.weight_rows)] = stored_bytes(layout, rows, t.n_cols, ex.binding_limit)
                layouts.add(f"repacked {layout.name}")
            else:
                seen[(st.weight, st.weight_rows)] = t.nbytes * rows // t.n_rows
                layouts.add("GGUF bytes")
        if kind == "experts":  # a 3-D expert tensor: its GGUF bytes, in windows of whole experts
            seen[(st.weight, None)] = ex.gguf.tensors[st.weight].nbytes
            layouts.add("GGUF bytes")
        for role, n in st.tensors.items():  # vectors, biases, scales, sinks: f32 on the device
            if role != "weight" or kind == "vector":
                seen[(n, None)] = 4 * math.prod(ex.gguf.tensors[n].shape)
    return sum(seen.values()), " and ".join(sorted(layouts)) or "none"


def cache_part(ex, positions: int) -> MemoryPart:
    """The KV cache in its types (labkit.model.cache_stages): each row in its blocks, padded to a word,
    and for a type smaller than f32 the one-layer f32 view its readers read it through; the detail says
    what a token's cache would take in f16 and f32."""
    from labkit.model.cache_stages import stored_types
    from labkit.ops.kv_cache import row_words

    cfg = ex.cfg
    types = stored_types(ex.graph)
    if not types:
        return MemoryPart("gpu", "kv cache", kv_bytes(cfg, positions, 4), kv_detail(cfg, "float32"))
    layers = len(cfg.attention_layers)
    widths = dict(zip("kv", cfg.cache_dims))
    row = sum(4 * row_words(types[k], w) if k in types else 4 * w for k, w in widths.items())
    views = sum(4 * positions * widths[k] for k in types)
    per_token = layers * row
    k, v = (types.get(kind, "f32") for kind in "kv")
    what = (
        f"{k if k == v else f'K {k}, V {v}'}: {per_token / 1024:.1f} KiB a token over {layers} layers (f16: "
        f"{kv_bytes(cfg, 1, 2) / 1024:.1f}, f32: {kv_bytes(cfg, 1, 4) / 1024:.1f}), and a one-layer f32 view"
    )
    return MemoryPart("gpu", "kv cache", positions * per_token + views, kv_detail(cfg, what))


def gpu_parts(ex, T: int, names, last_logits_only: bool, capacity: int | None = None) -> list[MemoryPart]:
    """The GPU path's parts for a pass of T tokens capturing `names` (all when None)."""
    from labkit.gpu.scratch import SEGMENT_BYTES, STREAM_MIN_TOKENS

    graph, cfg = ex.graph, ex.cfg
    wbytes, layout = weight_bytes(ex)
    kept = {st.name for st in graph} if names is None else set(names)
    captures = sum(stage_bytes(graph, T, 4, kept, last_logits_only).values())
    if T >= STREAM_MIN_TOKENS:  # streamed: scratch regions, captures held per segment
        regions = peak_live_bytes(graph, T, 4) + min(captures, SEGMENT_BYTES)
        how = "streamed: scratch regions and one segment of captures"
    elif names is None:  # every stage its own region
        regions = sum(stage_bytes(graph, T, 4, None, last_logits_only).values())
        how = "a region per stage"
    else:
        regions = peak_live_bytes(graph, T, 4, kept) + captures
        how = "captured stages' regions and scratch"
    return [
        MemoryPart("gpu", "weights", wbytes, layout),
        cache_part(ex, capacity or T),
        *state_part("gpu", cfg, 4),
        MemoryPart("gpu", "pass regions", regions, how, CAPTURE_HINT),
        MemoryPart("gpu", "captures", captures, f"{len(kept)} stages, float32 on the host", CAPTURE_HINT),
    ]
