// Mamba-2's causal conv1d, one thread a channel, the pass's tokens in order:
//   Y[t, c] = silu(sum_i W[c, i] * win[c, t + i] + Bias[c]),  win = [S[c, :], X[:, c]]  (d_conv - 1 + T)
// then the state is each channel's last d_conv - 1 inputs: win[c, state_start(T) + i].
// The sum is taken in the order ggml_ssm_conv takes it (taps 0..d_conv-1, f32), then the bias added.
// Composed before the part that says where the kept window starts (ssm_conv_state.wgsl, or a fault's).
// Interface:
//   @binding(0) X: array<f32>  [T, channels]  (xBC)
//   @binding(1) W: array<f32>  [channels, d_conv]
//   @binding(2) Bias: array<f32>  [channels]  (read where has_bias: the gated delta net's conv has none)
//   @binding(3) S: array<f32>  [channels, d_conv - 1], read and written in place (each thread its channel's)
//   @binding(4) Y: array<f32>  [T, channels]
//   @binding(5) P: Params
struct Params { T: u32, channels: u32, d_conv: u32, has_bias: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read> Bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;

const MAX_TAPS: u32 = 16u;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = gid.x + gid.y * nwg.x * 64u;
    if (c >= P.channels || P.d_conv > MAX_TAPS) { return; }
    let kept = P.d_conv - 1u;
    var old: array<f32, MAX_TAPS>;  // the state as the pass found it
    for (var i = 0u; i < kept; i++) { old[i] = S[c * kept + i]; }
    for (var t = 0u; t < P.T; t++) {
        var sum = 0.0;
        for (var i = 0u; i < P.d_conv; i++) {
            let j = t + i;  // in the window [old, X]
            var v: f32;
            if (j < kept) { v = old[j]; } else { v = X[(j - kept) * P.channels + c]; }
            sum += v * W[c * P.d_conv + i];
        }
        var b = 0.0;
        if (P.has_bias != 0u) { b = Bias[c]; }
        Y[t * P.channels + c] = silu(sum + b);
    }
    let first = state_start(P.T);
    for (var i = 0u; i < kept; i++) {
        let j = first + i;
        var v: f32;
        if (j < kept) { v = old[j]; } else { v = X[(j - kept) * P.channels + c]; }
        S[c * kept + i] = v;
    }
}
