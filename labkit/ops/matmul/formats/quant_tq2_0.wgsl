// TQ2_0: 256 ternary values in 66 bytes: qs[64] (2-bit digits 0..2), d (f16) at 64.
// For half n (0..1), shift s (0..3), l < 32 (v = 128n + 32s + l):
//   value[v] = d * (((qs[32n + l] >> 2s) & 3) - 1)
// (ggml dequantize_row_tq2_0.) Block interface: see quant_f32.wgsl. Composed with its offset part,
// quant_tq2_0_offset.wgsl (or a faulty one in its place).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 66u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 256u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let q = (read_u32(bb + 32u * (j >> 5u) + 4u * (j & 7u)) >> (2u * ((j >> 3u) & 3u))) & 0x03030303u;
    return Parts4(tq2_0_ternary(bytes4(q)), read_f16(bb + 64u), 0.0);
}
