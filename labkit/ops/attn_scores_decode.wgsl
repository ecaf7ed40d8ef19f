// Decode attention scores: one new query (T = 1) at position n_past against n_past + 1 cached keys.
// Same bindings and Params as attn_scores.wgsl, with Q and K read as vec4 (head_dim % 4 == 0, as
// attn_ctx requires): lavapipe issues a storage load per lane and per load, so a vec4 load does
// the work of four (one decode step after 512 tokens: SmolLM2's 30 layers of scores 19.0 -> 8.9 ms).
// One thread per (head, key); no causal mask is needed (every cached key is in the past) except
// the sliding window.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= P.n_heads * P.n_keys) { return; }
    let s = idx % P.n_keys;
    let h = idx / P.n_keys;
    if (P.window > 0u && P.n_past - s >= P.window) { S[idx] = bitcast<f32>(0xff800000u); return; }
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let hd4 = P.head_dim / 4u;
    let qb = h * hd4;
    let kb = (s * P.n_kv_heads + kvh) * hd4;
    var acc = 0.0;
    for (var d = 0u; d < hd4; d++) { acc += dot(Q[qb + d], K[kb + d]); }
    S[idx] = softcap(acc * P.scale, P.softcap);
}

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}
