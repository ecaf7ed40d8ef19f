// IQ2_XS: 256 values in 74 bytes: d (f16), qs[32] (u16 at 2: a 9-bit index into the 512 x 8 grid
// IQ2XS_GRID and a 7-bit sign code, KSIGNS, per 8 values), scales[8] at 66 (a nibble per 16
// values). value = d * (0.5 + s) * 0.25 * grid * sign. (ggml dequantize_row_iq2_xs.)
// Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 74u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let q = read_u16(bb + 2u + 2u * (j >> 1u));
    let grid = ibytes4(iq2xs_grid(2u * (q & 511u) + (j & 1u)));
    let signs = ksigns(q >> 9u) >> (4u * (j & 1u));
    let i = j >> 2u;  // 16-value group
    let s = (read_u8(bb + 66u + (i >> 1u)) >> (4u * (i & 1u))) & 15u;
    return Parts4(grid * signs4(signs), read_f16(bb) * (0.5 + f32(s)) * 0.25, 0.0);
}
