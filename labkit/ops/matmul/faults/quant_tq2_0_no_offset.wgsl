// FAULTY, in place of quant_tq2_0_offset.wgsl: digits 0..2 used as they are, d * t, not d * (t - 1).
fn tq2_0_ternary(digits: vec4<f32>) -> vec4<f32> {
    return digits;
}
