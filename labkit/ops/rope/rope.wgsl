// Rotary position embedding. Position of token t is pos0 + t (position(), in rope_position.wgsl).
//   neox  (gemma3, qwen2): pairs (i, i + rope_dim/2)
//   normal (llama):        pairs (2i, 2i + 1)
// theta_i = pos * base^(-2i / rope_dim) / pair_factor(i), scaled as scaled_angle says (both in
// rope_scale.wgsl); dims at or past rope_dim pass through. Which pairing: neox_pairs() in
// rope_pairing.wgsl (the faulty variant replaces that part). The parts are composed after this file.
// Interface: @binding(0) X: array<f32> [T, n_heads*head_dim], @binding(1) Y: array<f32> (same shape),
//            @binding(2) FACTORS: array<f32> [rope_dim/2], @binding(3) P: Params.
//            One thread per pair (and per two dims past rope_dim, copied): a pair's angle, cos and
//            sin come once, and each of its values is loaded once. Y is written from P.y_offset
//            (k_rope writes straight into the layer's K cache at the first new position).
struct Params { T: u32, n_heads: u32, head_dim: u32, rope_dim: u32, pos0: u32, neox: u32, base: f32, y_offset: u32,
                freq_scale: f32, ext_factor: f32, attn_factor: f32, corr_low: f32, corr_high: f32, has_factors: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> FACTORS: array<f32>;  // rope_freqs per pair (X, unread, where none)
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let pair = gid.x + gid.y * nwg.x * 64u;
    let pairs = P.head_dim / 2u;  // a head's threads
    if (pair >= P.T * P.n_heads * pairs) { return; }
    let t = pair / (P.n_heads * pairs);
    let head0 = (pair / pairs) * P.head_dim;  // the head's first value
    let i = pair % pairs;
    let half = P.rope_dim / 2u;
    if (i >= half) {  // past rope_dim: two dims copied as they are
        let j = head0 + P.rope_dim + 2u * (i - half);
        Y[P.y_offset + j] = X[j];
        Y[P.y_offset + j + 1u] = X[j + 1u];
        return;
    }
    var a = head0 + 2u * i;  // normal pairs (2i, 2i + 1)
    var b = a + 1u;
    if (neox_pairs()) {  // (i, i + rope_dim/2)
        a = head0 + i;
        b = a + half;
    }
    let theta_extrap = f32(position(t)) * pow(P.base, -2.0 * f32(i) / f32(P.rope_dim)) / pair_factor(i);
    let scaled = scaled_angle(theta_extrap, i);
    let theta = scaled.x;
    let m = scaled.y;
    let c = cos(theta) * m;
    let s = sin(theta) * m;
    let xa = X[a];
    let xb = X[b];
    Y[P.y_offset + a] = xa * c - xb * s;
    Y[P.y_offset + b] = xa * s + xb * c;
}
