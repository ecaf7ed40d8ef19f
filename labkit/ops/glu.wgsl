// Gated FFN activation: Y = act(G) * U, act 0 = GELU (tanh approximation, gemma), 1 = SiLU (llama, qwen2).
// tanh's argument is clamped to ±15 (where tanh is ±1 in f32): some drivers compute tanh
// as a ratio of exponentials that overflows to NaN for large inputs.
// Interface: @binding(0) G, @binding(1) U, @binding(2) Y: array<f32> [T, d_ff]; @binding(3) P.
struct Params { n: u32, act: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> G: array<f32>;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

fn gelu_tanh(x: f32) -> f32 {
    let inner = clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -15.0, 15.0);
    return 0.5 * x * (1.0 + tanh(inner));
}

fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.n) { return; }
    let g = G[i];
    let a = select(silu(g), gelu_tanh(g), P.act == 0u);
    Y[i] = a * U[i];
}
