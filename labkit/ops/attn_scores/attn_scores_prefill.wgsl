// Prefill attention scores for a fresh prompt (no cached positions): keys are the T new ones.
// Same Params as attn_scores.wgsl; n_past is assumed 0, which is what makes it the prefill path
// (post-mortem 000: running this in decode is the variant-selection bug).
// S[h, t, s] = scale * q[t, h] · k[s, kv_head(h)], masked (-inf) when s > t (causal) or, with a
// sliding window w > 0, when t - s >= w (llama.cpp's rule, with query t at position t).
// Interface: @binding(0) Q: [T, n_heads*head_dim]      as a texture: texel (w, t) = values 4w..4w+3 of row t
//            @binding(1) K: [n_keys, n_kv_heads*head_dim]  (the layer's KV cache), a texture the same way
//            @binding(2) S: array<f32> [n_heads, T, n_keys]
//            @binding(3) P: Params.
// The matmul's prefill tile (quad_step16.wgsl): a workgroup of 16 threads takes 16 queries of a head
// and 128 keys, each thread 8 keys; lane l loads queries l and 8 + l and subgroupBroadcast hands each
// query's 4 values to every lane, so per 4 dims a thread loads 8 key texels and 2 query texels for
// 128 products, where a thread of 8 queries x 4 keys loaded 12 for 32. A workgroup wholly in the
// future, or wholly before the window, writes -inf without a dot product (the test is uniform over
// the workgroup: the broadcasts need every lane). The dims are summed in the order the decode kernel
// sums them, so a position's scores are the same floats from either.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var Q: texture_2d<f32>;
@group(0) @binding(1) var K: texture_2d<f32>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const QUERIES_PER_WG: u32 = 16u;  // the host reads both: one workgroup per 16 queries x 128 keys of a head
const KEYS_PER_WG: u32 = 128u;  // 16 threads x 8 keys

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}

fn masked(t: u32, s: u32) -> bool {
    return s > t || (P.window > 0u && t - s >= P.window);  // prefill: query t is at position t
}

// query t's scores against this thread's keys s0..s0+7 (those that exist): lo holds keys s0..s0+3
fn store8(h: u32, t: u32, s0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (t >= P.T) { return; }
    let base = (h * P.T + t) * P.n_keys;
    let v = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    for (var j = 0u; j < 8u; j++) {
        let s = s0 + j;
        if (s < P.n_keys) {
            S[base + s] = select(softcap(v[j] * P.scale, P.softcap), bitcast<f32>(0xff800000u), masked(t, s));
        }
    }
}

// key s's texel d of KV head column kc, clamped to the last key (a key past the end is never stored)
fn key(kc: u32, d: u32, s: u32) -> vec4<f32> {
    return textureLoad(K, vec2<u32>(kc + d, min(s, P.n_keys - 1u)), 0);
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let nq = (P.T + QUERIES_PER_WG - 1u) / QUERIES_PER_WG;
    let nk = (P.n_keys + KEYS_PER_WG - 1u) / KEYS_PER_WG;
    if (lin >= P.n_heads * nq * nk) { return; }  // uniform per workgroup
    let s_wg = (lin % nk) * KEYS_PER_WG;
    let t0 = ((lin / nk) % nq) * QUERIES_PER_WG;
    let h = lin / (nk * nq);
    let s0 = s_wg + li * 8u;
    var acc: array<vec4<f32>, 32>;  // acc[2t]: query t0+t against keys s0..s0+3, acc[2t+1]: s0+4..s0+7
    let t_last = min(t0 + QUERIES_PER_WG - 1u, P.T - 1u);
    let all_future = s_wg > t_last;
    let all_before_window = P.window > 0u && t0 >= min(s_wg + KEYS_PER_WG - 1u, P.n_keys - 1u) + P.window;
    if (!all_future && !all_before_window) {
        let hd4 = P.head_dim / 4u;
        let qc = h * hd4;  // this head's first texel column in q, and its KV head's in K
        let kc = (h / (P.n_heads / P.n_kv_heads)) * hd4;
        let ta = min(t0 + (lane & 7u), t_last);  // this lane's two queries; past the last, the last again
        let tb = min(t0 + 8u + (lane & 7u), t_last);
        for (var d = 0u; d < hd4; d++) {
            let va = textureLoad(Q, vec2<u32>(qc + d, ta), 0);
            let vb = textureLoad(Q, vec2<u32>(qc + d, tb), 0);
            let ma = mat4x4<f32>(key(kc, d, s0), key(kc, d, s0 + 1u), key(kc, d, s0 + 2u), key(kc, d, s0 + 3u));
            let mb = mat4x4<f32>(key(kc, d, s0 + 4u), key(kc, d, s0 + 5u), key(kc, d, s0 + 6u), key(kc, d, s0 + 7u));
            quad_step(&acc, 0u, va, vb, ma);  // a constant h: acc's indices fold
            quad_step(&acc, 1u, va, vb, mb);
        }
    }
    store8(h, t0, s0, acc[0], acc[1]);
    store8(h, t0 + 1u, s0, acc[2], acc[3]);
    store8(h, t0 + 2u, s0, acc[4], acc[5]);
    store8(h, t0 + 3u, s0, acc[6], acc[7]);
    store8(h, t0 + 4u, s0, acc[8], acc[9]);
    store8(h, t0 + 5u, s0, acc[10], acc[11]);
    store8(h, t0 + 6u, s0, acc[12], acc[13]);
    store8(h, t0 + 7u, s0, acc[14], acc[15]);
    store8(h, t0 + 8u, s0, acc[16], acc[17]);
    store8(h, t0 + 9u, s0, acc[18], acc[19]);
    store8(h, t0 + 10u, s0, acc[20], acc[21]);
    store8(h, t0 + 11u, s0, acc[22], acc[23]);
    store8(h, t0 + 12u, s0, acc[24], acc[25]);
    store8(h, t0 + 13u, s0, acc[26], acc[27]);
    store8(h, t0 + 14u, s0, acc[28], acc[29]);
    store8(h, t0 + 15u, s0, acc[30], acc[31]);
}
