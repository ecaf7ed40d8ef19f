// Attention scores, pre-softmax, masked: S[h, t, s] = scale * q[t, h] · k[s, h / (n_heads/n_kv_heads)]
// Query t sits at position n_past + t. Key s is masked (-inf) when s > n_past + t (causal) or,
// with a sliding window w > 0, when (n_past + t) - s >= w (llama.cpp's rule): `masked`, from
// attn_mask.wgsl, composed after this file (a faulty mask file makes the window_off_by_one variant).
// Interface: @binding(0) Q: array<f32> [T, n_heads*head_dim]
//            @binding(1) K: array<f32> [>= n_keys, n_kv_heads*head_dim]  (the layer's KV cache)
//            @binding(2) S: array<f32> [n_heads, T, n_keys]
//            @binding(3) P: Params. One thread per score.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= P.n_heads * P.T * P.n_keys) { return; }
    let s = idx % P.n_keys;
    let t = (idx / P.n_keys) % P.T;
    let h = idx / (P.n_keys * P.T);
    let qpos = P.n_past + t;
    if (masked(qpos, s)) { S[idx] = bitcast<f32>(0xff800000u); return; }
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let qb = t * P.n_heads * P.head_dim + h * P.head_dim;
    let kb = s * P.n_kv_heads * P.head_dim + kvh * P.head_dim;
    var acc = 0.0;
    for (var d = 0u; d < P.head_dim; d++) { acc += Q[qb + d] * K[kb + d]; }
    S[idx] = softcap(acc * P.scale, P.softcap);
}

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}
