// TQ2_0's offset part (composed after quant_tq2_0.wgsl): digits 0..2 are the values -1..1.
fn tq2_0_ternary(digits: vec4<f32>) -> vec4<f32> {
    return digits - 1.0;
}
