// Y[t, g, :] = [A[t, g, 0..wa), B[t, g, 0..wb)], one thread an output element.
struct Params { n: u32, groups: u32, wa: u32, wb: u32, a_offset: u32, b_offset: u32, y_offset: u32, _p0: u32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    let w = P.wa + P.wb;
    let row = k / w;  // (t, g) in order
    let i = k % w;
    if (i < P.wa) {
        Y[P.y_offset + k] = A[P.a_offset + row * P.wa + i];
    } else {
        Y[P.y_offset + k] = B[P.b_offset + row * P.wb + i - P.wa];
    }
}
