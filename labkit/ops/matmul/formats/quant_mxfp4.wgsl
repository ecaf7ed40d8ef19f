// MXFP4: 32 values in 17 bytes: e (E8M0 scale byte), qs[16] (4-bit E2M1 codes). KVALUES_MXFP4
// holds the E2M1 values doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), so the scale is
// half of 2^(e - 127): ggml's e8m0_to_fp32_half. value[i] = scale * kvalues[qs[i] & 15],
// value[i + 16] = scale * kvalues[qs[i] >> 4]. (ggml dequantize_row_mxfp4.)
// Blocks are byte-aligned only. Block interface: see quant_f32.wgsl. Composed with its scale part,
// quant_mxfp4_scale.wgsl (or a faulty one in its place).
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 17u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let nib = (read_u32(bb + 1u + 4u * (j & 3u)) >> (4u * (j >> 2u))) & 0x0f0f0f0fu;
    return Parts4(lookup_kvalues_mxfp4(nib), e8m0_half(read_u8(bb)), 0.0);
}
