// Decode attention scores: one new query (T = 1) at position n_past against n_past + 1 cached keys.
// Same bindings and Params as attn_scores.wgsl, with Q and K read as vec4 (head_dim % 4 == 0, as
// attn_ctx requires): lavapipe issues a storage load per lane and per load, so the count of
// loads sets the speed.
// One thread per key and per group of HEADS_PER_THREAD query heads that share a KV head (GQA):
// each K vec4 it loads serves every head of the group, and q comes to it through the subgroup
// (lane l loads vec4 l of each 8, subgroupBroadcast hands them out), so a workgroup's lanes, all
// on one group of heads, load q once between them. Per 8 vec4 of a head's dims a thread loads
// 8 of K and 4 of q for 4 heads' scores, where one thread per (head, key) loaded 64.
// One decode step after 512 tokens (lavapipe, AMD EPYC family 25, 2 cores): Gemma 3's 18 layers of
// scores 71-75 -> 20 ms, SmolLM2's 30 layers 70-78 -> 27 ms.
// A workgroup covers KEYS_PER_WG keys of one group of heads (the host reads both constants), and
// loops over the units a short dispatch left it. No causal mask is needed (every cached key is
// in the past) except the sliding window.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const HEADS_PER_THREAD: u32 = 4u;
const KEYS_PER_WG: u32 = 16u;  // the workgroup size: one key a thread

// acc + q · k over 8 vec4, one vec4 after another: the order of the prefill kernel's sums, so a
// position's scores are the same floats whether a prefill or a decode step computes them
fn add_dot8(acc: f32, q: Vec8, k: Vec8) -> f32 {
    var s = acc + dot(q.a, k.a);
    s += dot(q.b, k.b);
    s += dot(q.c, k.c);
    s += dot(q.d, k.d);
    s += dot(q.e, k.e);
    s += dot(q.f, k.f);
    s += dot(q.g, k.g);
    return s + dot(q.h, k.h);
}

// A thread's work: its key (lanes past the last key score the last one again, never stored), its
// KV head, its first query head and the end of that KV head's query heads.
struct Unit { key: u32, live: bool, kv_head: u32, h0: u32, h_end: u32 }

fn unit_at(u: u32, li: u32) -> Unit {
    let g = P.n_heads / P.n_kv_heads;
    let groups = (g + HEADS_PER_THREAD - 1u) / HEADS_PER_THREAD;  // head groups per KV head
    let key_wgs = (P.n_keys + KEYS_PER_WG - 1u) / KEYS_PER_WG;
    let hg = u / key_wgs;
    let kvh = hg / groups;
    let s = (u % key_wgs) * KEYS_PER_WG + li;
    return Unit(min(s, P.n_keys - 1u), s < P.n_keys, kvh, kvh * g + (hg % groups) * HEADS_PER_THREAD, (kvh + 1u) * g);
}

// The first vec4 of q of head h0 + i (a head past the group's end reads the last head, never stored)
fn q_row(w: Unit, i: u32) -> u32 {
    return min(w.h0 + i, w.h_end - 1u) * (P.head_dim / 4u);
}

// The unit's 4 heads' q · k over the key's head_dim
fn head_dots(w: Unit, lane: u32) -> vec4<f32> {
    let hd4 = P.head_dim / 4u;
    let kb = (w.key * P.n_kv_heads + w.kv_head) * hd4;
    let qa = q_row(w, 0u);
    let qb = q_row(w, 1u);
    let qc = q_row(w, 2u);
    let qd = q_row(w, 3u);
    var acc = vec4<f32>();
    let whole = hd4 / 8u * 8u;
    for (var d = 0u; d < whole; d += 8u) {
        let k = kb + d;
        let k8 = Vec8(K[k], K[k + 1u], K[k + 2u], K[k + 3u], K[k + 4u], K[k + 5u], K[k + 6u], K[k + 7u]);
        let l = d + lane;
        acc = vec4<f32>(add_dot8(acc.x, broadcast8(Q[qa + l]), k8), add_dot8(acc.y, broadcast8(Q[qb + l]), k8),
                        add_dot8(acc.z, broadcast8(Q[qc + l]), k8), add_dot8(acc.w, broadcast8(Q[qd + l]), k8));
    }
    for (var d = whole; d < hd4; d++) {  // head_dim % 32 != 0: the rest, q loaded by every lane
        let k = K[kb + d];
        acc += vec4<f32>(dot(Q[qa + d], k), dot(Q[qb + d], k), dot(Q[qc + d], k), dot(Q[qd + d], k));
    }
    return acc;
}

fn store(w: Unit, i: u32, x: f32) {
    if (w.live && w.h0 + i < w.h_end) {
        var v = softcap(x * P.scale, P.softcap);
        if (P.window > 0u && P.n_past - w.key >= P.window) {
            v = bitcast<f32>(0xff800000u);
        }
        S[(w.h0 + i) * P.n_keys + w.key] = v;
    }
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let g = P.n_heads / P.n_kv_heads;
    let units = P.n_kv_heads * ((g + HEADS_PER_THREAD - 1u) / HEADS_PER_THREAD) * ((P.n_keys + KEYS_PER_WG - 1u) / KEYS_PER_WG);
    for (var u = wid.x + wid.y * nwg.x; u < units; u += nwg.x * nwg.y) {  // uniform per workgroup
        let w = unit_at(u, li);
        let s = head_dots(w, lane & 7u);
        store(w, 0u, s.x);
        store(w, 1u, s.y);
        store(w, 2u, s.z);
        store(w, 3u, s.w);
    }
}

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}
