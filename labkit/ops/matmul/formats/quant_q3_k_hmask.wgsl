// Q3_K's high-bit part (composed after quant_q3_k.wgsl): a CLEAR mask bit subtracts 4, as ggml's
// "(hm & m) ? 0 : 4" does. low: the 2 low bits; high: the mask bits (0 or 1) of 4 values.
fn q3_k_quants(low: vec4<f32>, high: vec4<f32>) -> vec4<f32> {
    return low + 4.0 * high - 4.0;
}
