// FAULTY, in place of quant_mxfp4_scale.wgsl: E8M0 read as the full 2^(e - 127) with the doubled
// E2M1 table, so every value comes out twice its size.
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(e << 23u);
}
