// BF16 cache rows (ggml_compute_fp32_to_bf16: the top half of the f32, to nearest, ties to even; a NaN
// kept quiet). A "block" is 4 values (quant_bf16.wgsl).
const BLOCKS: u32 = 1u;

fn bf16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u >> 16u) | 64u;
    }
    return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}

fn quantize_block(x: u32, at: u32) {
    for (var i = 0u; i < 4u; i++) {
        put_u16(at + 2u * i, bf16_bits(X[x + i]));
    }
}
