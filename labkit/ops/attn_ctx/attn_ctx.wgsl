// Attention context: C[t, h*head_dim + d] = Σ_s probs[h, t, s] · V[s, kv_head(h)*head_dim + d]
// Interface (A, C and P declared in attn_ctx_io.wgsl, composed before this file):
//            @binding(0) A: array<f32> [n_heads, T, n_keys] (probabilities)
//            @binding(1) V: [n_keys, n_kv_heads*head_dim] (the layer's V cache), declared with
//                          v_texel() by a file composed after this one: attn_ctx_v_texture.wgsl
//                          (prefill) or attn_ctx_v_buffer.wgsl (decode)
//            @binding(2) C: [T, n_heads*head_dim], written as vec4 (head_dim % 4 == 0)
//            @binding(3) P: Params.
// A workgroup of 8 threads takes TILE_T = 16 queries of a head and DIMS_PER_WG = 64 of its dims
// (the host reads both), each thread 8 dims: per key, lane l loads the probabilities of queries l
// and 8 + l and subgroupBroadcast hands them to every lane, so a thread loads 2 probabilities and 2
// V texels for 32 vec4 products, where a thread of 4 queries x 16 dims loaded 4 and 4 for 16 (on
// lavapipe the count of loads sets the speed). In a prefill V is a texture (lavapipe gathers those
// for all lanes at once; labkit/gpu/texture.py); in a decode step it stays a buffer (one query
// reads each value once: copying the whole cache into a texture every step would cost more than
// it saves). Each query sums its keys in order, one product a key, as the decode kernel does, so a
// position's context is the same floats from either.
// Keys first_key(t0) .. last_key(t_last) - 1 are summed, from a file composed after this one:
// attn_ctx_keys_masked.wgsl (the default: the keys the mask lets the tile's queries see) or
// attn_ctx_keys_every.wgsl (every key). A query's keys outside its own range have probability 0.

const TILE_T: u32 = 16u;
const DIMS_PER_WG: u32 = 64u;  // 8 threads x 2 vec4

// query t's context at this thread's two vec4 of dims (w: the first), those of the head
fn store2(t: u32, h: u32, w: u32, hd4: u32, a: vec4<f32>, b: vec4<f32>) {
    if (t >= P.T) { return; }
    let cb = t * P.n_heads * hd4 + h * hd4 + w;
    if (w < hd4) { C[cb] = a; }
    if (w + 1u < hd4) { C[cb + 1u] = b; }
}

// acc[2t] += p_t * va and acc[2t+1] += p_t * vb for the 16 queries (p_t: lane t & 7 of pa for
// t < 8, of pb after): written out, since a broadcast's lane is a constant and a constant index
// keeps the accumulators in registers
fn key_step(acc: ptr<function, array<vec4<f32>, 32>>, pa: f32, pb: f32, va: vec4<f32>, vb: vec4<f32>) {
    let p0 = subgroupBroadcast(pa, 0u);
    (*acc)[0] += p0 * va;
    (*acc)[1] += p0 * vb;
    let p1 = subgroupBroadcast(pa, 1u);
    (*acc)[2] += p1 * va;
    (*acc)[3] += p1 * vb;
    let p2 = subgroupBroadcast(pa, 2u);
    (*acc)[4] += p2 * va;
    (*acc)[5] += p2 * vb;
    let p3 = subgroupBroadcast(pa, 3u);
    (*acc)[6] += p3 * va;
    (*acc)[7] += p3 * vb;
    let p4 = subgroupBroadcast(pa, 4u);
    (*acc)[8] += p4 * va;
    (*acc)[9] += p4 * vb;
    let p5 = subgroupBroadcast(pa, 5u);
    (*acc)[10] += p5 * va;
    (*acc)[11] += p5 * vb;
    let p6 = subgroupBroadcast(pa, 6u);
    (*acc)[12] += p6 * va;
    (*acc)[13] += p6 * vb;
    let p7 = subgroupBroadcast(pa, 7u);
    (*acc)[14] += p7 * va;
    (*acc)[15] += p7 * vb;
    let p8 = subgroupBroadcast(pb, 0u);
    (*acc)[16] += p8 * va;
    (*acc)[17] += p8 * vb;
    let p9 = subgroupBroadcast(pb, 1u);
    (*acc)[18] += p9 * va;
    (*acc)[19] += p9 * vb;
    let p10 = subgroupBroadcast(pb, 2u);
    (*acc)[20] += p10 * va;
    (*acc)[21] += p10 * vb;
    let p11 = subgroupBroadcast(pb, 3u);
    (*acc)[22] += p11 * va;
    (*acc)[23] += p11 * vb;
    let p12 = subgroupBroadcast(pb, 4u);
    (*acc)[24] += p12 * va;
    (*acc)[25] += p12 * vb;
    let p13 = subgroupBroadcast(pb, 5u);
    (*acc)[26] += p13 * va;
    (*acc)[27] += p13 * vb;
    let p14 = subgroupBroadcast(pb, 6u);
    (*acc)[28] += p14 * va;
    (*acc)[29] += p14 * vb;
    let p15 = subgroupBroadcast(pb, 7u);
    (*acc)[30] += p15 * va;
    (*acc)[31] += p15 * vb;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let hd4 = P.head_dim / 4u;
    let nd = (P.head_dim + DIMS_PER_WG - 1u) / DIMS_PER_WG;  // dim blocks per head
    let nt = (P.T + TILE_T - 1u) / TILE_T;
    if (lin >= nt * P.n_heads * nd) { return; }  // uniform per workgroup
    let w = (lin % nd) * (DIMS_PER_WG / 4u) + 2u * li;  // this thread's first vec4 of dims
    let h = (lin / nd) % P.n_heads;
    let t0 = (lin / (nd * P.n_heads)) * TILE_T;
    let t_last = min(t0 + TILE_T - 1u, P.T - 1u);
    // this lane's two queries' probability rows; past the last query, the last again (never stored)
    let a_a = (h * P.T + min(t0 + (lane & 7u), t_last)) * P.n_keys;
    let a_b = (h * P.T + min(t0 + 8u + (lane & 7u), t_last)) * P.n_keys;
    // this thread's two texel columns of V; past the head's end they repeat its last (never stored)
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let wa = kvh * hd4 + min(w, hd4 - 1u);
    let wb = kvh * hd4 + min(w + 1u, hd4 - 1u);
    var acc: array<vec4<f32>, 32>;
    for (var s = first_key(t0); s < last_key(t_last); s++) {
        key_step(&acc, A[a_a + s], A[a_b + s], v_texel(wa, s), v_texel(wb, s));
    }
    store2(t0 + 0u, h, w, hd4, acc[0], acc[1]);
    store2(t0 + 1u, h, w, hd4, acc[2], acc[3]);
    store2(t0 + 2u, h, w, hd4, acc[4], acc[5]);
    store2(t0 + 3u, h, w, hd4, acc[6], acc[7]);
    store2(t0 + 4u, h, w, hd4, acc[8], acc[9]);
    store2(t0 + 5u, h, w, hd4, acc[10], acc[11]);
    store2(t0 + 6u, h, w, hd4, acc[12], acc[13]);
    store2(t0 + 7u, h, w, hd4, acc[14], acc[15]);
    store2(t0 + 8u, h, w, hd4, acc[16], acc[17]);
    store2(t0 + 9u, h, w, hd4, acc[18], acc[19]);
    store2(t0 + 10u, h, w, hd4, acc[20], acc[21]);
    store2(t0 + 11u, h, w, hd4, acc[22], acc[23]);
    store2(t0 + 12u, h, w, hd4, acc[24], acc[25]);
    store2(t0 + 13u, h, w, hd4, acc[26], acc[27]);
    store2(t0 + 14u, h, w, hd4, acc[28], acc[29]);
    store2(t0 + 15u, h, w, hd4, acc[30], acc[31]);
}
