// Prefill attention scores for a fresh prompt shorter than the prefill tile's 16 queries
// (attn_scores_prefill.wgsl): keys are the T new ones. That tile, started on a prompt of 8 tokens
// or fewer, ran 15-20x slower on lavapipe for the rest of the process (40 ms a stage, where this
// kernel takes 2), and wastes most of its 16 x 128 tile on so few scores.
// Same Params as attn_scores.wgsl; n_past is assumed 0, which is what makes it the prefill path
// (post-mortem 000: running this in decode is the variant-selection bug).
// S[h, t, s] = scale * q[t, h] · k[s, kv_head(h)], masked (-inf) when s > t (causal) or, with a
// sliding window w > 0, when t - s >= w (llama.cpp's rule, with query t at position t).
// Interface: @binding(0) Q: [T, n_heads*head_dim]      as a texture: texel (w, t) = values 4w..4w+3 of row t
//            @binding(1) K: [n_keys, n_kv_heads*head_dim]  (the layer's KV cache), a texture the same way
//            @binding(2) S: array<f32> [n_heads, T, n_keys]
//            @binding(3) P: Params.
// One thread per tile of TILE_Q queries x TILE_K keys of a head (the host reads the two
// constants): each k vec4 it loads serves 8 scores and each q vec4 4, where one thread per score
// loaded two values per multiply-add (8 x 4 against 4 x 4: 2048 Gemma tokens' scores 3.7 -> 3.0
// s). On lavapipe the count of loads sets the speed; q and K are textures, which lavapipe
// gathers for all lanes at once (labkit/gpu/texture.py). A tile wholly in the
// future, or wholly before the window, is written -inf without a dot product.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var Q: texture_2d<f32>;
@group(0) @binding(1) var K: texture_2d<f32>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const TILE_Q: u32 = 8u;
const TILE_K: u32 = 4u;

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}

fn masked(t: u32, s: u32) -> bool {
    return s > t || (P.window > 0u && t - s >= P.window);  // prefill: query t is at position t
}

// the scores of query t against keys s0..s0+3 (those that exist)
fn store4(h: u32, t: u32, s0: u32, acc: vec4<f32>) {
    if (t >= P.T) { return; }
    let base = (h * P.T + t) * P.n_keys;
    let v = array<f32, 4>(acc.x, acc.y, acc.z, acc.w);
    for (var j = 0u; j < TILE_K; j++) {
        let s = s0 + j;
        if (s < P.n_keys) {
            S[base + s] = select(softcap(v[j] * P.scale, P.softcap), bitcast<f32>(0xff800000u), masked(t, s));
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let nq = (P.T + TILE_Q - 1u) / TILE_Q;
    let nk = (P.n_keys + TILE_K - 1u) / TILE_K;
    if (idx >= P.n_heads * nq * nk) { return; }
    let s0 = (idx % nk) * TILE_K;
    let t0 = ((idx / nk) % nq) * TILE_Q;
    let h = idx / (nk * nq);
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
    var a4 = vec4<f32>();
    var a5 = vec4<f32>();
    var a6 = vec4<f32>();
    var a7 = vec4<f32>();
    let t_last = min(t0 + TILE_Q - 1u, P.T - 1u);
    let s_last = min(s0 + 3u, P.n_keys - 1u);
    let all_future = s0 > t_last;
    let all_before_window = P.window > 0u && t0 >= s_last + P.window;
    if (!all_future && !all_before_window) {
        let hd4 = P.head_dim / 4u;
        let kvh = h / (P.n_heads / P.n_kv_heads);
        let qc = h * hd4;  // this head's first texel column in q, and its KV head's in K
        let kc = kvh * hd4;
        // rows past the last query repeat it (their scores are never stored)
        let t1 = min(t0 + 1u, t_last);
        let t2 = min(t0 + 2u, t_last);
        let t3 = min(t0 + 3u, t_last);
        let t4 = min(t0 + 4u, t_last);
        let t5 = min(t0 + 5u, t_last);
        let t6 = min(t0 + 6u, t_last);
        let s1 = min(s0 + 1u, s_last);
        let s2 = min(s0 + 2u, s_last);
        for (var d = 0u; d < hd4; d++) {
            let km = mat4x4<f32>(textureLoad(K, vec2<u32>(kc + d, s0), 0), textureLoad(K, vec2<u32>(kc + d, s1), 0),
                                 textureLoad(K, vec2<u32>(kc + d, s2), 0), textureLoad(K, vec2<u32>(kc + d, s_last), 0));
            a0 += textureLoad(Q, vec2<u32>(qc + d, t0), 0) * km;
            a1 += textureLoad(Q, vec2<u32>(qc + d, t1), 0) * km;
            a2 += textureLoad(Q, vec2<u32>(qc + d, t2), 0) * km;
            a3 += textureLoad(Q, vec2<u32>(qc + d, t3), 0) * km;
            a4 += textureLoad(Q, vec2<u32>(qc + d, t4), 0) * km;
            a5 += textureLoad(Q, vec2<u32>(qc + d, t5), 0) * km;
            a6 += textureLoad(Q, vec2<u32>(qc + d, t6), 0) * km;
            a7 += textureLoad(Q, vec2<u32>(qc + d, t_last), 0) * km;
        }
    }
    store4(h, t0, s0, a0);
    store4(h, t0 + 1u, s0, a1);
    store4(h, t0 + 2u, s0, a2);
    store4(h, t0 + 3u, s0, a3);
    store4(h, t0 + 4u, s0, a4);
    store4(h, t0 + 5u, s0, a5);
    store4(h, t0 + 6u, s0, a6);
    store4(h, t0 + 7u, s0, a7);
}
