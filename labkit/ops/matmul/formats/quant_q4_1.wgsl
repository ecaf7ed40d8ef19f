// Q4_1: 32 values in 20 bytes: d (f16), m (f16), qs[16].
// value[i] = d * (qs[i] & 15) + m and value[i + 16] = d * (qs[i] >> 4) + m, i < 16.
// (ggml dequantize_row_q4_1.) Block interface: see quant_f32.wgsl.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let q = read_u32(bb + 4u + 4u * (j & 3u));
    let nib = (q >> ((j >> 2u) * 4u)) & 0x0f0f0f0fu;
    return Parts4(bytes4(nib), read_f16(bb), read_f16(bb + 2u));
}
