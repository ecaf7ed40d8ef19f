// F16 cache rows (ggml_fp32_to_fp16_row: to nearest, ties to even). A "block" is 4 values (quant_f16.wgsl).
const BLOCKS: u32 = 1u;

fn quantize_block(x: u32, at: u32) {
    for (var i = 0u; i < 4u; i++) {
        put_u16(at + 2u * i, half_bits(X[x + i]));
    }
}
