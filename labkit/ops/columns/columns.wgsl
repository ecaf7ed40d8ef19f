// Y[t, g * width + i] = X[t * stride + offset + g * step + i], one thread an output element (each buffer
// from its region's offset). Where group g starts in a row: group_start(g), in columns_start.wgsl (a fault's
// part), composed after this file.
struct Params { n: u32, width: u32, groups: u32, stride: u32, step: u32, offset: u32, x_offset: u32, y_offset: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    let row = P.groups * P.width;
    let t = k / row;
    let g = (k % row) / P.width;
    let i = k % P.width;
    Y[P.y_offset + k] = X[P.x_offset + t * P.stride + group_start(g) + i];
}
