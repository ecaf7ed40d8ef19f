// The gated delta rule, the recurrent form: one thread a (value head h, value row j), the pass's
// tokens in order, its state row M[h, j, :] (d_k floats) updated in place, as ggml_gated_delta_net:
//   M *= exp(G[t, h]);  d = (v[j] - M·k) * strength(B[t, h]);  M += d * k;  Y[t, h, j] = M·q / sqrt(d_k)
// q and k are those of key head key_head(h); v is the conv's output at v_offset. Composed before
// two parts, each correct or a fault's: strength (delta_net_strength.wgsl) and the state a pass
// starts from (delta_net_start.wgsl).
// Interface:
//   @binding(0) Q, @binding(1) K: array<f32>  [T, n_k_head * head_k]  (L2-normed)
//   @binding(2) CV: array<f32>  [T, channels]  (v at v_offset)
//   @binding(3) G, @binding(4) B: array<f32>  [T, n_head]  (log-decay, write strength)
//   @binding(5) S: array<f32>  [n_head, head_v, head_k], read and written in place
//   @binding(6) Y: array<f32>  [T, n_head * head_v]
//   @binding(7) P: Params
struct Params { T: u32, n_head: u32, n_k_head: u32, head_k: u32, head_v: u32, channels: u32, v_offset: u32, interleave: u32 }
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> CV: array<f32>;
@group(0) @binding(3) var<storage, read> G: array<f32>;
@group(0) @binding(4) var<storage, read> B: array<f32>;
@group(0) @binding(5) var<storage, read_write> S: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;
@group(0) @binding(7) var<uniform> P: Params;

// the key head value head h reads: tiled (h mod n_k_head, ggml's gated_delta_net) or repeated in place
// (h / (n_head / n_k_head), Qwen3-Next's graph)
fn key_head(h: u32) -> u32 {
    if (P.interleave != 0u) { return h / (P.n_head / P.n_k_head); }
    return h % P.n_k_head;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;  // h * head_v + j
    let width = P.n_head * P.head_v;
    if (row >= width) { return; }
    let h = row / P.head_v;
    let N = P.head_k;
    let base = row * N;
    let qk0 = key_head(h) * N;
    let qk_w = P.n_k_head * N;
    let scale = 1.0 / sqrt(f32(N));
    for (var n = 0u; n < N; n++) { S[base + n] = start(S[base + n]); }
    for (var t = 0u; t < P.T; t++) {
        let a = exp(G[t * P.n_head + h]);
        let kq = t * qk_w + qk0;
        var sk = 0.0;
        for (var n = 0u; n < N; n++) {
            let s = S[base + n] * a;
            S[base + n] = s;
            sk += s * K[kq + n];
        }
        let d = (CV[t * P.channels + P.v_offset + row] - sk) * strength(B[t * P.n_head + h]);
        var o = 0.0;
        for (var n = 0u; n < N; n++) {
            let s = S[base + n] + d * K[kq + n];
            S[base + n] = s;
            o += s * Q[kq + n];
        }
        Y[t * width + row] = o * scale;
    }
}
