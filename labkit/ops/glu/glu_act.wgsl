// The gated FFN activation, shared by glu.wgsl and the matvec epilogue (epilogue_glu.wgsl):
// act(g) * u, act 0 = GELU (tanh approximation, gemma), 1 = SiLU (llama, qwen2); act 2 is gpt-oss's
// clamped SwiGLU (ggml's swiglu_oai): g clamped above and u on both sides at 7, then
// g · sigmoid(1.702 g) · (u + 1).
// tanh's argument is clamped to ±15 (where tanh is ±1 in f32): some drivers compute tanh
// as a ratio of exponentials that overflows to NaN for large inputs.
fn gelu_tanh(x: f32) -> f32 {
    let inner = clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -15.0, 15.0);
    return 0.5 * x * (1.0 + tanh(inner));
}

fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }

fn swiglu_oai(g: f32, u: f32) -> f32 {
    let x = min(g, 7.0);
    let y = clamp(u, -7.0, 7.0);
    return x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
}

fn glu(g: f32, u: f32, act: u32) -> f32 {
    if (act == 2u) { return swiglu_oai(g, u); }
    let a = select(silu(g), gelu_tanh(g), act == 0u);
    return a * u;
}
