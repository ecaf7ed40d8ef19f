// NVFP4: 64 values in 36 bytes: 4 unsigned E4M3 scales (bias 7; one per 16 values), qs[32]
// (4-bit E2M1 codes, MXFP4's doubled KVALUES_MXFP4, so each scale is halved). Sub-block b's 16
// values: the low nibbles of qs[8b .. 8b + 8], then their high nibbles. A scale byte of 0 or
// 0x7f is 0. (ggml dequantize_row_nvfp4, gguf.quants.NVFP4.) Block interface: quant_f32.wgsl.
const QK: u32 = 64u;
const BLOCK_BYTES: u32 = 36u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn ue4m3_half(x: u32) -> f32 {
    if (x == 0u || x == 0x7fu) {
        return 0.0;
    }
    let e = (x >> 3u) & 15u;
    let m = f32(x & 7u);
    if (e == 0u) {
        return m * exp2(-10.0);  // subnormal: m 2^-9, halved
    }
    return (1.0 + m / 8.0) * exp2(f32(e) - 8.0);
}

fn parts4(bb: u32, j: u32) -> Parts4 {
    let b = j >> 2u;  // 16-value sub-block
    let nib = (read_u32(bb + 4u + 8u * b + 4u * (j & 1u)) >> (4u * ((j >> 1u) & 1u))) & 0x0f0f0f0fu;
    return Parts4(lookup_kvalues_mxfp4(nib), ue4m3_half(read_u8(bb + b)), 0.0);
}
