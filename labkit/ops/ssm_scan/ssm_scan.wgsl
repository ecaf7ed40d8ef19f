// Mamba-2's selective scan, the recurrent form: one thread a (head h, row p), the pass's tokens
// in order, its state row S[h, p, :] updated in place (as ggml_ssm_scan: d_state fastest):
//   dt' = step(DT[t, h]);  a = decay(dt', A[h]);  S[n] = S[n]·a + B[t, g, n]·(X[t, h, p]·dt');  Y = Σ_n S[n]·C[t, g, n]
// g = h / (n_head / n_group). X, B and C are the conv's output row: x at 0, B at head_dim·n_head,
// C after B (`channels` floats a token). Composed before three parts, each correct or a fault's:
// step (ssm_scan_step.wgsl), decay (ssm_scan_decay.wgsl), and the state a pass starts from (ssm_scan_start.wgsl).
// Interface:
//   @binding(0) XBC: array<f32>  [T, channels]
//   @binding(1) DT: array<f32>  [T, n_head]  (dt + its bias)
//   @binding(2) A: array<f32>  [n_head]
//   @binding(3) S: array<f32>  [n_head, head_dim, d_state], read and written in place
//   @binding(4) Y: array<f32>  [T, n_head·head_dim]
//   @binding(5) P: Params
struct Params { T: u32, n_head: u32, head_dim: u32, d_state: u32, n_group: u32, channels: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> XBC: array<f32>;
@group(0) @binding(1) var<storage, read> DT: array<f32>;
@group(0) @binding(2) var<storage, read> A: array<f32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;  // h * head_dim + p
    let d_inner = P.n_head * P.head_dim;
    if (row >= d_inner) { return; }
    let h = row / P.head_dim;
    let g = h / (P.n_head / P.n_group);
    let N = P.d_state;
    let base = row * N;
    let b0 = d_inner + g * N;
    let c0 = d_inner + P.n_group * N + g * N;
    for (var n = 0u; n < N; n++) { S[base + n] = start(S[base + n]); }
    for (var t = 0u; t < P.T; t++) {
        let sp = step(DT[t * P.n_head + h]);
        let a = decay(sp, A[h]);
        let xdt = XBC[t * P.channels + row] * sp;
        let tok = t * P.channels;
        var sum = 0.0;
        for (var n = 0u; n < N; n++) {
            let s = S[base + n] * a + XBC[tok + b0 + n] * xdt;
            S[base + n] = s;
            sum += s * XBC[tok + c0 + n];
        }
        Y[t * d_inner + row] = sum;
    }
}
