// Elementwise add with a repeating second operand: Y[y_offset + i] = A[i] + scale * B[i % period]
// (scale 1 but in Granite's muP residuals).
// period = n for the residual add; period = row width for a bias (qwen2's q/k/v bias).
// y_offset (in floats) places the result inside a bigger buffer: qwen2's biased v goes straight
// into the KV cache at position n_past.
// Interface: @binding(0) A, @binding(1) B, @binding(2) Y: array<f32>; @binding(3) P. One thread per element.
struct Params { n: u32, period: u32, y_offset: u32, scale: f32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.n) { return; }
    Y[P.y_offset + i] = A[i] + P.scale * B[i % P.period];
}
