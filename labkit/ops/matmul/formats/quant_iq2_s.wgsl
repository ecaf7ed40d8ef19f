// IQ2_S: 256 values in 82 bytes: d (f16), qs[32] at 2 (low 8 bits of indices into the 1024 x 8
// grid IQ2S_GRID, one per 8 values), signs[32] at 34 (one bit per value), qh[8] at 66 (2 high
// index bits each), scales[8] at 74 (a nibble per 16 values).
// value = d * (0.5 + s) * 0.25 * grid * sign. (ggml dequantize_row_iq2_s.)
// Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 82u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let m = j >> 1u;  // which 8 values
    let high = (read_u8(bb + 66u + (m >> 2u)) >> (2u * (m & 3u))) & 3u;
    let grid = ibytes4(iq2s_grid(2u * (read_u8(bb + 2u + m) | (high << 8u)) + (j & 1u)));
    let signs = read_u8(bb + 34u + m) >> (4u * (j & 1u));
    let i = j >> 2u;
    let s = (read_u8(bb + 74u + (i >> 1u)) >> (4u * (i & 1u))) & 15u;
    return Parts4(grid * signs4(signs), read_f16(bb) * (0.5 + f32(s)) * 0.25, 0.0);
}
