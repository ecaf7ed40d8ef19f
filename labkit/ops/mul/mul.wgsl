// Elementwise multiply with a repeating second operand: Y[y_offset + i] = A[i] * B[i % period].
// period = 1 for a per-tensor scale (BitNet's weight scales), the row width for a per-row one.
// Interface: @binding(0) A, @binding(1) B, @binding(2) Y: array<f32>; @binding(3) P. One thread per element.
struct Params { n: u32, period: u32, y_offset: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.n) { return; }
    Y[P.y_offset + i] = A[i] * B[i % P.period];
}
