// Gated FFN activation: Y = act(G) * U, act 0 = GELU (tanh approximation, gemma), 1 = SiLU (llama, qwen2),
// 2 = gpt-oss's clamped SwiGLU.
// Composed after glu_act.wgsl (the activation, shared with the matvec epilogue).
// Interface: @binding(0) G, @binding(1) U, @binding(2) Y: array<f32> [T, d_ff]; @binding(3) P.
struct Params { n: u32, act: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> G: array<f32>;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.n) { return; }
    Y[i] = glu(G[i], U[i], P.act);
}
