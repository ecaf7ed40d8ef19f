// IQ1_M: 256 values in 56 bytes: qs[32], qh[16] at 32 (a nibble per 8 values: 3 high index bits
// into IQ1S_GRID and the shift's sign), scales[4] (u16) at 48: 3-bit scales, four per u16, and
// the f16 d in the top nibbles (low nibble first). value = d * (2s + 1) * (grid ± 1/8), s per 16
// values (ggml dequantize_row_iq1_m). As in IQ1_S, q = 8 grid ± 1 and scale = d (2s + 1) / 8.
// Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 56u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;

fn iq1_m_d(bb: u32) -> f32 {
    let lo = read_u32(bb + 48u);
    let hi = read_u32(bb + 52u);
    let bits = ((lo >> 12u) & 0xfu) | ((lo >> 24u) & 0xf0u) | ((hi >> 4u) & 0xf00u) | ((hi >> 16u) & 0xf000u);
    return unpack2x16float(bits).x;
}

fn parts4(bb: u32, j: u32) -> Parts4 {
    let m = j >> 1u;  // which 8 values
    let nib = (read_u8(bb + 32u + (m >> 1u)) >> (4u * (m & 1u))) & 15u;
    let grid = ibytes4(iq1s_grid(2u * (read_u8(bb + m) | ((nib & 7u) << 8u)) + (j & 1u)));
    let shift = select(1.0, -1.0, (nib & 8u) != 0u);
    let i = j >> 2u;  // 16-value group
    let s = (read_u16(bb + 48u + 2u * (i >> 2u)) >> (3u * (i & 3u))) & 7u;
    return Parts4(8.0 * grid + shift, iq1_m_d(bb) * f32(2u * s + 1u) * 0.125, 0.0);
}
