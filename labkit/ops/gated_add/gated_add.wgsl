// Y[t, i] = M[t, i] + S[t, i] / (1 + exp(-G[t])): the shared expert weighed by its token's gate.
struct Params { n: u32, width: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> M: array<f32>;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    Y[k] = M[k] + S[k] / (1.0 + exp(-G[k / P.width]));
}
