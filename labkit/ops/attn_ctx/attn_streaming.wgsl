// Fused streaming attention (online softmax): C = softmax(mask(scale * q·k)) · v in one pass over
// the keys, never materializing scores or probabilities (so those stages are not captured).
// Bindings: @binding(0) Q [T, n_heads*head_dim], @binding(1) K cache, @binding(2) V cache,
//           @binding(3) C [T, n_heads*head_dim], @binding(4) SINKS [n_heads] (any buffer without
//           sinks), @binding(5) P (attn_scores.wgsl's Params).
// With P.sinks (gpt-oss) the running max and sum start at the head's sink logit (a key whose value
// is zero: it takes its share of the softmax and adds nothing to the context).
// One thread per output element (t, h, d): it recomputes the row's running max and sum.
// llvmpipe ends an invocation's loops after 65535 turns in all (tests/ops/test_loop_turns.py), so the dot over
// head_dim is written out in 16-value steps (up to 256 dims; a loop only past that): a thread's
// loop turns are its keys, where a loop over head_dim made them keys x head_dim, and a 3000-key
// context (head_dim 128) came out wrong on lavapipe. labkit.ops.attn_ctx refuses a longer one.
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
        var x = head_dot(qb, kb);
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

// 16 products from e on (e + 16 <= head_dim)
fn dot16(qb: u32, kb: u32, e: u32) -> f32 {
    var x = 0.0;
    x += Q[qb + e] * K[kb + e] + Q[qb + e + 1u] * K[kb + e + 1u] + Q[qb + e + 2u] * K[kb + e + 2u] + Q[qb + e + 3u] * K[kb + e + 3u];
    x += Q[qb + e + 4u] * K[kb + e + 4u] + Q[qb + e + 5u] * K[kb + e + 5u] + Q[qb + e + 6u] * K[kb + e + 6u] + Q[qb + e + 7u] * K[kb + e + 7u];
    x += Q[qb + e + 8u] * K[kb + e + 8u] + Q[qb + e + 9u] * K[kb + e + 9u] + Q[qb + e + 10u] * K[kb + e + 10u] + Q[qb + e + 11u] * K[kb + e + 11u];
    x += Q[qb + e + 12u] * K[kb + e + 12u] + Q[qb + e + 13u] * K[kb + e + 13u] + Q[qb + e + 14u] * K[kb + e + 14u] + Q[qb + e + 15u] * K[kb + e + 15u];
    return x;
}

// q[qb..] . k[kb..] over head_dim: whole 16-value steps written out, then the rest one by one
fn head_dot(qb: u32, kb: u32) -> f32 {
    let hd = P.head_dim;
    var x = 0.0;
    if (hd >= 16u) { x += dot16(qb, kb, 0u); }
    if (hd >= 32u) { x += dot16(qb, kb, 16u); }
    if (hd >= 48u) { x += dot16(qb, kb, 32u); }
    if (hd >= 64u) { x += dot16(qb, kb, 48u); }
    if (hd >= 80u) { x += dot16(qb, kb, 64u); }
    if (hd >= 96u) { x += dot16(qb, kb, 80u); }
    if (hd >= 112u) { x += dot16(qb, kb, 96u); }
    if (hd >= 128u) { x += dot16(qb, kb, 112u); }
    if (hd >= 144u) { x += dot16(qb, kb, 128u); }
    if (hd >= 160u) { x += dot16(qb, kb, 144u); }
    if (hd >= 176u) { x += dot16(qb, kb, 160u); }
    if (hd >= 192u) { x += dot16(qb, kb, 176u); }
    if (hd >= 208u) { x += dot16(qb, kb, 192u); }
    if (hd >= 224u) { x += dot16(qb, kb, 208u); }
    if (hd >= 240u) { x += dot16(qb, kb, 224u); }
    if (hd >= 256u) { x += dot16(qb, kb, 240u); }
    for (var e = min(hd, 256u) / 16u * 16u; e < hd; e++) { x += Q[qb + e] * K[kb + e]; }
    return x;
}
