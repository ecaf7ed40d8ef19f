// MXFP4's scale part (composed after quant_mxfp4.wgsl): 2^(e - 128), half of E8M0's 2^(e - 127)
// because the E2M1 table is doubled (ggml's e8m0_to_fp32_half); e < 2 gives a subnormal, as ggml's.
fn e8m0_half(e: u32) -> f32 {
    if (e < 2u) {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}
