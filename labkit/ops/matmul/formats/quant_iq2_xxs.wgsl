// IQ2_XXS: 256 values in 66 bytes: d (f16), then per 32 values two u32: aux0's 4 bytes index the
// 256 x 8 grid IQ2XXS_GRID (8 values each); aux1 holds four 7-bit sign codes (KSIGNS: 8 signs
// each) and, in bits 28..31, the scale s. value = d * (0.5 + s) * 0.25 * grid * sign.
// (ggml dequantize_row_iq2_xxs.) Block interface: see quant_f32.wgsl. Composed with its sign part,
// quant_iq2_xxs_signs.wgsl (or a faulty one in its place).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 66u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let aux0 = read_u32(bb + 2u + 8u * (j >> 3u));
    let aux1 = read_u32(bb + 6u + 8u * (j >> 3u));
    let k = (j >> 1u) & 3u;  // which 8 values of the 32
    let grid = ibytes4(iq2xxs_grid(2u * ((aux0 >> (8u * k)) & 255u) + (j & 1u)));
    let signs = ksigns((aux1 >> (7u * k)) & 127u) >> (4u * (j & 1u));
    return Parts4(iq2_xxs_signed(grid, signs), read_f16(bb) * (0.5 + f32(aux1 >> 28u)) * 0.25, 0.0);
}
