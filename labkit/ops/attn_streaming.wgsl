// Fused streaming attention (online softmax): C = softmax(mask(scale * q·k)) · v in one pass over
// the keys, never materializing scores or probabilities (so those stages are not captured).
// Bindings: @binding(0) Q [T, n_heads*head_dim], @binding(1) K cache, @binding(2) V cache,
//           @binding(3) C [T, n_heads*head_dim], @binding(4) SINKS [n_heads] (any buffer without
//           sinks), @binding(5) P (attn_scores.wgsl's Params).
// With P.sinks (gpt-oss) the running max and sum start at the head's sink logit (a key whose value
// is zero: it takes its share of the softmax and adds nothing to the context).
// One thread per output element (t, h, d): it recomputes the row's running max and sum.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
@group(0) @binding(4) var<storage, read> SINKS: array<f32>;  // [n_heads], read where P.sinks
@group(0) @binding(5) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let row = P.n_heads * P.head_dim;
    if (idx >= P.T * row) { return; }
    let t = idx / row;
    let h = (idx % row) / P.head_dim;
    let d = idx % P.head_dim;
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let stride = P.n_kv_heads * P.head_dim;
    let qb = t * row + h * P.head_dim;
    let qpos = P.n_past + t;
    var m = bitcast<f32>(0xff800000u);
    var l = 0.0;
    if (P.sinks != 0u) { m = SINKS[h]; l = 1.0; }
    var acc = 0.0;
    for (var s = 0u; s <= qpos; s++) {
        if (P.window > 0u && qpos - s >= P.window) { continue; }
        let kb = s * stride + kvh * P.head_dim;
        var x = 0.0;
        for (var e = 0u; e < P.head_dim; e++) { x += Q[qb + e] * K[kb + e]; }
        x = softcap(x * P.scale, P.softcap);
        let m_new = max(m, x);
        let corr = exp(m - m_new);
        let p = exp(x - m_new);
        l = l * corr + p;
        acc = acc * corr + p * V[kb + d];
        m = m_new;
    }
    C[idx] = acc / l;
}

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}
