// Mamba-2's skip term: Z[t, i] = Y[t, i] + XBC[t, i] * D[i / head_dim], i < d_inner (x leads each
// conv row of `channels` floats). One thread an element.
struct Params { n: u32, head_dim: u32, channels: u32, d_inner: u32 }
@group(0) @binding(0) var<storage, read> Y: array<f32>;
@group(0) @binding(1) var<storage, read> XBC: array<f32>;
@group(0) @binding(2) var<storage, read> D: array<f32>;
@group(0) @binding(3) var<storage, read_write> Z: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    let t = k / P.d_inner;
    let i = k % P.d_inner;
    Z[k] = Y[k] + XBC[t * P.channels + i] * D[i / P.head_dim];
}
