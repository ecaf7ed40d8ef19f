// A mixture of experts' output: Y[t, i] = sum_s W[t, s] * X[t, s, i], slot by slot in order.
// Interface: @binding(0) X [T, k, n], @binding(1) W [T, k], @binding(2) Y [T, n]; @binding(3) P.
struct Params { T: u32, k: u32, n: u32, x_offset: u32, w_offset: u32, y_offset: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.T * P.n) { return; }
    let t = i / P.n;
    let c = i % P.n;
    var acc = 0.0;
    for (var s = 0u; s < P.k; s++) {
        acc += W[P.w_offset + t * P.k + s] * X[P.x_offset + (t * P.k + s) * P.n + c];
    }
    Y[P.y_offset + i] = acc;
}
