// Soft-capping (Gemma 2's final logits): Y = cap * tanh(X / cap), elementwise.
// Interface: @binding(0) X, @binding(1) Y: array<f32>; @binding(2) P. One thread per element.
struct Params { n: u32, cap: f32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.n) { return; }
    Y[i] = P.cap * tanh(clamp(X[i] / P.cap, -15.0, 15.0));  // clamped as in glu.wgsl
}
