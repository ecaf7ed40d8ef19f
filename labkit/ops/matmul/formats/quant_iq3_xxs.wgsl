// IQ3_XXS: 256 values in 98 bytes: d (f16), qs[64] (indices into the 256 x 4 grid IQ3XXS_GRID),
// then 8 u32 at 66, one per 32 values: bits 0..27 four 7-bit sign codes (KSIGNS: 8 signs each),
// bits 28..31 the scale s. value = d * (0.5 + s) * 0.5 * grid[qs[j]] * sign.
// (ggml dequantize_row_iq3_xxs.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 98u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let aux = read_u32(bb + 66u + 4u * (j >> 3u));
    let db = read_f16(bb) * (0.5 + f32(aux >> 28u)) * 0.5;
    let grid = ibytes4(iq3xxs_grid(read_u8(bb + 2u + j)));
    let signs = ksigns((aux >> (7u * ((j >> 1u) & 3u))) & 127u) >> (4u * (j & 1u));
    return Parts4(grid * signs4(signs), db, 0.0);
}
