// IQ1_S: 256 values in 50 bytes: d (f16), qs[32] at 2, qh[8] (u16) at 34, one per 32 values:
// bits 3k..3k+2 are the high bits of index qs[4ib + k] into the 2048 x 8 grid IQ1S_GRID (-1, 0, 1),
// bits 12..14 the scale s, bit 15 the shift's sign. value = d * (2s + 1) * (grid ± 1/8)
// (ggml dequantize_row_iq1_s). Here q = 8 grid ± 1 and scale = d (2s + 1) / 8: the same values,
// exactly, as int8 quants. Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 50u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let qh = read_u16(bb + 34u + 2u * (j >> 3u));
    let m = j >> 1u;  // which 8 values
    let grid = ibytes4(iq1s_grid(2u * (read_u8(bb + 2u + m) | (((qh >> (3u * (m & 3u))) & 7u) << 8u)) + (j & 1u)));
    let shift = select(1.0, -1.0, (qh & 0x8000u) != 0u);
    return Parts4(8.0 * grid + shift, read_f16(bb) * f32(2u * ((qh >> 12u) & 7u) + 1u) * 0.125, 0.0);
}
