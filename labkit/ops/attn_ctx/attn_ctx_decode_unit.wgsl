// What both decode context drivers share (attn_ctx_decode.wgsl: 8 threads a unit, for llvmpipe;
// attn_ctx_decode_wide.wgsl: 256, for real GPUs), composed before them: the geometry constants the
// host reads, a thread's unit of work (its vec4 of dims for a group of HEADS_PER_THREAD query heads
// that share a KV head), a key's probabilities for the group, and one key's weighted V added in.
const TILE_T: u32 = 1u;
const TILE_D: u32 = 4u;
const HEADS_PER_THREAD: u32 = 4u;
const DIMS_PER_WG: u32 = 32u;  // 8 threads x TILE_D

// A thread's work: its vec4 of dims (lanes past the head's last score the last again, never
// stored), its KV head, its first query head and the end of that KV head's query heads.
struct Unit { d4: u32, live: bool, kv_head: u32, h0: u32, h_end: u32 }

fn unit_at(u: u32, li: u32) -> Unit {
    let g = P.n_heads / P.n_kv_heads;
    let groups = (g + HEADS_PER_THREAD - 1u) / HEADS_PER_THREAD;  // head groups per KV head
    let hd4 = P.head_dim / 4u;
    let d_wgs = (hd4 * 4u + DIMS_PER_WG - 1u) / DIMS_PER_WG;
    let hg = u / d_wgs;
    let kvh = hg / groups;
    let d4 = (u % d_wgs) * (DIMS_PER_WG / 4u) + li;
    return Unit(min(d4, hd4 - 1u), d4 < hd4, kvh, kvh * g + (hg % groups) * HEADS_PER_THREAD, (kvh + 1u) * g);
}

// Key s's probabilities for the group's 4 heads (0 for a head past the group's end or a key past `last`)
fn probs(w: Unit, s: u32, last: u32) -> vec4<f32> {
    let k = min(s, last - 1u);
    let n = w.h_end - w.h0;
    let a = w.h0 * P.n_keys + k;
    let p = vec4<f32>(A[a], A[a + min(1u, n - 1u) * P.n_keys], A[a + min(2u, n - 1u) * P.n_keys], A[a + min(3u, n - 1u) * P.n_keys]);
    return select(vec4<f32>(), p, vec4<bool>(s < last) & (vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(n)));
}

// c[i] += p[i] * V row of key s, for a key before `last` (uniform: the last turn's 8 keys may pass it)
fn add_key(c: ptr<function, array<vec4<f32>, 4>>, p: vec4<f32>, w: Unit, s: u32, last: u32) {
    if (s >= last) {
        return;
    }
    let v = v_texel(w.kv_head * (P.head_dim / 4u) + w.d4, s);
    (*c)[0] += p.x * v;
    (*c)[1] += p.y * v;
    (*c)[2] += p.z * v;
    (*c)[3] += p.w * v;
}

// The units of a step: each group of heads times each DIMS_PER_WG dims of a head
fn unit_count() -> u32 {
    let g = P.n_heads / P.n_kv_heads;
    let d_wgs = (P.head_dim + DIMS_PER_WG - 1u) / DIMS_PER_WG;
    return P.n_kv_heads * ((g + HEADS_PER_THREAD - 1u) / HEADS_PER_THREAD) * d_wgs;
}

// A unit's context vectors, one for each head of its group that exists
fn store_unit(w: Unit, c: array<vec4<f32>, 4>) {
    for (var i = 0u; i < HEADS_PER_THREAD; i++) {
        if (w.live && w.h0 + i < w.h_end) {
            C[(w.h0 + i) * (P.head_dim / 4u) + w.d4] = c[i];
        }
    }
}
