// FAULTY, in place of quant_q3_k_hmask.wgsl: the mask read with its meaning inverted, so a SET bit
// subtracts 4 (ggml subtracts it where the bit is clear).
fn q3_k_quants(low: vec4<f32>, high: vec4<f32>) -> vec4<f32> {
    return low - 4.0 * high;
}
