// Q3_K: 256 values in 110 bytes: hmask[32], qs[64] (2 low bits), scales[12] (16 6-bit scales),
// d (f16) at 108. For half n (0..1), shift s (0..3), l < 32 (v = 128n + 32s + l):
//   low  = (qs[32n + l] >> 2s) & 3
//   high = bit (4n + s) of hmask[l]; a CLEAR bit subtracts 4 (ggml: "- ((hm & m) ? 0 : 4)")
//   value[v] = d * (scale[v / 16] - 32) * (low - 4 * (1 - high))
// Scale i: low nibble (scales[i & 7] >> 4 (i >> 3)) & 15, high bits (scales[8 + (i & 3)] >> 2 (i >> 2)) & 3.
// (ggml dequantize_row_q3_K.) Block interface: see quant_f32.wgsl. Composed with its high-bit part,
// quant_q3_k_hmask.wgsl (or a faulty one in its place).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn q3_k_scale(bb: u32, i: u32) -> f32 {
    let lo = (read_u8(bb + 96u + (i & 7u)) >> (4u * (i >> 3u))) & 15u;
    let hi = (read_u8(bb + 104u + (i & 3u)) >> (2u * (i >> 2u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

fn parts4(bb: u32, j: u32) -> Parts4 {
    let n = j >> 5u;
    let s = (j >> 3u) & 3u;
    let l0 = 4u * (j & 7u);
    let low = (read_u32(bb + 32u + 32u * n + l0) >> (2u * s)) & 0x03030303u;
    let high = (read_u32(bb + l0) >> (4u * n + s)) & 0x01010101u;
    let q = q3_k_quants(bytes4(low), bytes4(high));
    return Parts4(q, read_f16(bb + 108u) * q3_k_scale(bb, j >> 2u), 0.0);
}
