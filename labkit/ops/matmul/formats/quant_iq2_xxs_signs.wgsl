// IQ2_XXS's sign part (composed after quant_iq2_xxs.wgsl): bit i of `signs` set makes value i negative.
fn iq2_xxs_signed(grid: vec4<f32>, signs: u32) -> vec4<f32> {
    return grid * signs4(signs);
}
