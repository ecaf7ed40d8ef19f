// Each head's vector divided by its L2 norm, one thread a head (group): head g of token t is
// X[t * stride + offset + (g % per_row) * group + i], i < group; Y is [T, per_row * group].
// Composed before the part that turns the sum of squares into the factor (l2norm_scale.wgsl, or a fault's).
struct Params { n_groups: u32, group: u32, per_row: u32, stride: u32, offset: u32, eps: f32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = gid.x + gid.y * nwg.x * 64u;
    if (g >= P.n_groups) { return; }
    let t = g / P.per_row;
    let src = t * P.stride + P.offset + (g % P.per_row) * P.group;
    let dst = g * P.group;
    var s = 0.0;
    for (var i = 0u; i < P.group; i++) { let v = X[src + i]; s += v * v; }
    let f = inv_norm(s, P.eps);
    for (var i = 0u; i < P.group; i++) { Y[dst + i] = X[src + i] * f; }
}
