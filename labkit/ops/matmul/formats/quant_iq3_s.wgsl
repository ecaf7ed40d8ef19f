// IQ3_S: 256 values in 110 bytes: d (f16), qs[64] (low 8 bits of indices into the 512 x 4 grid
// IQ3S_GRID) at 2, qh[8] (their 9th bits) at 66, signs[32] (one bit per value) at 74, scales[4]
// (a nibble per 32 values) at 106. value = d * (1 + 2 s) * grid[qs | qh bit << 8] * sign.
// (ggml dequantize_row_iq3_s.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let high = (read_u8(bb + 66u + (j >> 3u)) >> (j & 7u)) & 1u;
    let grid = ibytes4(iq3s_grid(read_u8(bb + 2u + j) | (high << 8u)));
    let signs = read_u8(bb + 74u + (j >> 1u)) >> (4u * (j & 1u));
    let ib = j >> 3u;
    let s = (read_u8(bb + 106u + (ib >> 1u)) >> (4u * (ib & 1u))) & 15u;
    return Parts4(grid * signs4(signs), read_f16(bb) * f32(1u + 2u * s), 0.0);
}
