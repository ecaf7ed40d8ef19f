"""How many loop turns one invocation of an attention context kernel takes, for llvmpipe's cap.

llvmpipe (lavapipe) ends an invocation's loops after 65535 turns in all: every loop whose trip
count is not a small constant counts, nested ones turn by turn, and past the cap the loops just
stop, so the output is wrong with no error (tests/ops/test_loop_turns.py measures it). The fused tiers
loop over every key a query sees, so their turns grow with the context; their WGSL writes the
inner loops out to keep the count near two a key (streaming) or 300 a chunk of 64 keys (tiled),
and `attn_ctx.plan` refuses a context whose count would pass the cap. The counts are read off
the WGSL's loops, with a measured margin for the tiled tier (UNMODELED); tests check each tier
right at its bound on lavapipe, and docs/architecture.md gives where each went wrong past it.
The unfused kernels (`masked`, `masked_wide`, `every_key`) loop once over the keys too, a key a turn, so in a
decode step, whose V is a buffer and not a texture of at most 16384 rows, they meet the cap at
65535 keys of context."""

from __future__ import annotations

from labkit.errors import GpuLimitError
from labkit.ops.base import ceil_div, wgsl_const, wgsl_file


def loop(trips: int) -> int:
    """Turns a loop takes: one a trip, and one more for the test that ends it."""
    return trips + 1


def tail_turns(head_dim: int) -> int:
    """Turns of a dot over head_dim written out in 16-value steps up to 256: its loop over the rest
    (a loop counts its ending test even when it makes no trip, and even under an if not taken)."""
    return loop(head_dim - min(head_dim, 256) // 16 * 16)


def unfused_turns(n_keys: int, head_dim: int) -> int:
    """attn_ctx.wgsl and attn_ctx_decode.wgsl: one loop over the keys a tile of queries sees. A
    sliding window would shorten it, but not on the layers without one, so every key counts."""
    return loop(n_keys)


def streaming_turns(n_keys: int, head_dim: int) -> int:
    """attn_streaming.wgsl: its loop over the keys, and each key's dot's tail."""
    return loop(n_keys) + n_keys * tail_turns(head_dim)


def tiled_turns(n_keys: int, head_dim: int) -> int:
    """attn_tiled.wgsl, a tile whose every query sees the keys: per chunk of keys, two loops over the
    tile's queries (scores, then folding: a loop of TILE constant trips may stay a loop) and, per
    query, its dot's tail and two loops over the chunk, 4 keys a trip; the q load, the start and the
    final store around them."""
    src = wgsl_file("attn_tiled")
    tile, chunk = wgsl_const(src, "TILE", 8), wgsl_const(src, "CHUNK", 64)
    n_chunks = ceil_div(n_keys, chunk)
    per_chunk = 2 * loop(tile) + tile * (tail_turns(head_dim) + 2 * loop(ceil_div(chunk, 4))) + UNMODELED
    return loop(n_chunks) + n_chunks * per_chunk + loop(ceil_div(tile * head_dim, 64)) + 4 * loop(tile)


UNMODELED = 8  # turns a chunk takes that the loops above do not show: 299-303 measured against 298


TURNS = {
    "masked": unfused_turns,
    "masked_wide": unfused_turns,
    "every_key": unfused_turns,
    "streaming": streaming_turns,
    "tiled": tiled_turns,
}


def max_keys(kernel: str, head_dim: int, cap: int) -> int:
    """The longest context (keys a query sees) a tier stays within `cap` turns for."""
    lo, hi = 0, 1 << 22
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if TURNS[kernel](mid, head_dim) <= cap else (lo, mid - 1)
    return lo


def check(stage_name: str, kernel: str, n_keys: int, head_dim: int, cap: int | None) -> None:
    """GpuLimitError when a shipped kernel would pass the device's loop-turn cap (None: no cap)."""
    if cap is None or kernel not in TURNS or TURNS[kernel](n_keys, head_dim) <= cap:
        return
    longest = {k: max_keys(k, head_dim, cap) for k in TURNS if k != "every_key"}  # every_key is a fault
    reach = ", ".join(f"{k} {n}" for k, n in longest.items())
    further = [k for k, n in longest.items() if n >= n_keys]
    fix = f", or {' or '.join(further)}: lab.use('attn_ctx', name)" if further else "; no kernel reaches that here"
    raise GpuLimitError(
        f"{stage_name}: the {kernel} attention kernel over {n_keys} keys (head_dim {head_dim}) would take one "
        f"invocation past llvmpipe's {cap} loop turns, where its loops stop and the output is wrong. The keys "
        f"each kernel reaches on this device: {reach}. Use fewer tokens{fix}."
    )


def fused_tier(n_keys: int, cap: int | None, head_dim: int = 256) -> str | None:
    """The fused attention tier to suggest for a context of n_keys when the unfused one cannot run
    (its maps or its V texture too big): tiled, the fast one (a 256-token Gemma 3 270M pass on
    lavapipe: 8.6 s, against over 100 s streaming), unless the device's loop cap stops it short of
    n_keys; then streaming, which reaches further; None when neither does. head_dim: the largest a
    message may meet (the reach is the same for any head_dim up to 256)."""
    for tier in ("tiled", "streaming"):
        if cap is None or TURNS[tier](n_keys, head_dim) <= cap:
            return tier
    return None


def fused_tier_hint(n_keys: int, cap: int | None) -> str:
    """The sentence an error for a context too long for the unfused attention ends with: what to do."""
    tier = fused_tier(n_keys, cap)
    if tier is None:
        return "No fused attention kernel reaches that many keys here: use a shorter prompt."
    slower = (
        ' ("streaming" also reaches longer contexts under llvmpipe\'s loop cap, far slower)' if tier == "tiled" else ""
    )
    return (
        f'Use a shorter prompt, or variants={{"attn_ctx": "{tier}"}} (or lab.use("attn_ctx", "{tier}")): fused '
        f"attention does not materialize the scores and probabilities, and reads V from a buffer{slower}."
    )
