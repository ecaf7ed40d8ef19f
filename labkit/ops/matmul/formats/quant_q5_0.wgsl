// Q5_0: 32 values in 22 bytes: d (f16), qh (u32, the 5th bit of each value), qs[16].
// value[i]      = d * (((qs[i] & 15) | (bit i      of qh) << 4) - 16), i < 16
// value[i + 16] = d * (((qs[i] >> 4) | (bit i + 16 of qh) << 4) - 16)
// (ggml dequantize_row_q5_0.) Block interface: see quant_f32.wgsl.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let qh = read_u32(bb + 2u);
    let q = read_u32(bb + 6u + 4u * (j & 3u));
    let lo = (q >> ((j >> 2u) * 4u)) & 0x0f0f0f0fu;
    let h = (qh >> (4u * j)) & 0xfu;  // bits 4j..4j+3 belong to values 4j..4j+3
    return Parts4(bytes4(lo | spread4(h)) - 16.0, read_f16(bb), 0.0);
}
