// Attention context in a decode step (T = 1): C[h*head_dim + d] = Σ_s probs[h, s] · V[s, kv_head(h)*head_dim + d]
// Same interface as attn_ctx.wgsl (the prefill kernel), composed the same way: V from
// attn_ctx_v_buffer.wgsl, the key range from attn_ctx_keys_masked.wgsl or _every.wgsl.
// One thread per vec4 of dims and per group of HEADS_PER_THREAD query heads that share a KV head
// (GQA): each V vec4 it loads serves every head of the group. The probabilities come through the
// subgroup: for 8 keys at a time lane l loads key l's (one vec4, the group's 4 heads), and
// subgroupBroadcast hands them out, so a workgroup's lanes, all on one group of heads, load each
// probability once between them. Per 8 keys a thread loads 8 vec4 of V and 4 probabilities for
// 4 heads, where one thread per (head, vec4 of dims) loaded 64 values.
// One decode step after 512 tokens (lavapipe, AMD EPYC family 25, 2 cores): Gemma 3's 18 layers of
// context 53-61 -> 20 ms, SmolLM2's 30 layers 50-59 -> 24-31 ms.
// A workgroup covers DIMS_PER_WG dims of one group of heads (the host reads both constants),
// and loops over the units a short dispatch left it.

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

fn context(w: Unit, lane: u32) -> array<vec4<f32>, 4> {
    var c: array<vec4<f32>, 4>;
    let first = first_key(0u);
    let last = last_key(0u);
    for (var s = first; s < last; s += 8u) {
        let p = broadcast8(probs(w, s + lane, last));
        add_key(&c, p.a, w, s, last);  // the 8 keys written out: a constant lane for each broadcast
        add_key(&c, p.b, w, s + 1u, last);
        add_key(&c, p.c, w, s + 2u, last);
        add_key(&c, p.d, w, s + 3u, last);
        add_key(&c, p.e, w, s + 4u, last);
        add_key(&c, p.f, w, s + 5u, last);
        add_key(&c, p.g, w, s + 6u, last);
        add_key(&c, p.h, w, s + 7u, last);
    }
    return c;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let g = P.n_heads / P.n_kv_heads;
    let d_wgs = (P.head_dim + DIMS_PER_WG - 1u) / DIMS_PER_WG;
    let units = P.n_kv_heads * ((g + HEADS_PER_THREAD - 1u) / HEADS_PER_THREAD) * d_wgs;
    for (var u = wid.x + wid.y * nwg.x; u < units; u += nwg.x * nwg.y) {  // uniform per workgroup
        let w = unit_at(u, li);
        let c = context(w, lane & 7u);
        for (var i = 0u; i < HEADS_PER_THREAD; i++) {
            if (w.live && w.h0 + i < w.h_end) {
                C[(w.h0 + i) * (P.head_dim / 4u) + w.d4] = c[i];
            }
        }
    }
}
