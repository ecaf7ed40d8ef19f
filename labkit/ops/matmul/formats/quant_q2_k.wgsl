// Q2_K: 256 values in 84 bytes: scales[16] (low nibble scale, high nibble min, one per 16
// values), qs[64] (2-bit quants), d (f16) at 80, dmin (f16) at 82.
// For half n (0..1), shift s (0..3), l < 32 (v = 128n + 32s + l):
//   q = (qs[32n + l] >> 2s) & 3,  value[v] = d * (scales[v / 16] & 15) * q - dmin * (scales[v / 16] >> 4)
// (ggml dequantize_row_q2_K.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let n = j >> 5u;           // 128-value half
    let s = (j >> 3u) & 3u;    // 2-bit field of each byte
    let l0 = 4u * (j & 7u);    // first l of the 4 values
    let q = (read_u32(bb + 16u + 32u * n + l0) >> (2u * s)) & 0x03030303u;
    let sc = read_u8(bb + (j >> 2u));  // the 16-value group of value 4j
    return Parts4(bytes4(q), read_f16(bb + 80u) * f32(sc & 15u), -(read_f16(bb + 82u) * f32(sc >> 4u)));
}
