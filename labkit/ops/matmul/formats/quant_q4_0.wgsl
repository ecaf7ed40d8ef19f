// Q4_0: 32 values in 18 bytes: d (f16), qs[16].
// value[i] = d * ((qs[i] & 15) - 8) and value[i + 16] = d * ((qs[i] >> 4) - 8), i < 16.
// (ggml dequantize_row_q4_0.) Block interface: see quant_f32.wgsl.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let q = read_u32(bb + 2u + 4u * (j & 3u));       // qs[4(j%4) .. 4(j%4)+3]
    let nib = (q >> ((j >> 2u) * 4u)) & 0x0f0f0f0fu;  // low nibbles for j < 4, high after
    return Parts4(bytes4(nib) - 8.0, read_f16(bb), 0.0);
}
