// The delta rule's log-decay: G[t, h] = step(biased(Alpha[t, h], Bias[h])) * signed(A[h]),
// one thread an element. Composed before three parts, each correct or a fault's: step
// (delta_decay_softplus.wgsl), biased (delta_decay_bias.wgsl) and signed (delta_decay_sign.wgsl).
struct Params { n: u32, n_head: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> Alpha: array<f32>;
@group(0) @binding(1) var<storage, read> Bias: array<f32>;
@group(0) @binding(2) var<storage, read> A: array<f32>;
@group(0) @binding(3) var<storage, read_write> G: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    let h = k % P.n_head;
    G[k] = step(biased(Alpha[k], Bias[h])) * signed(A[h]);
}
