// IQ4_XS: 256 values in 136 bytes: d (f16), scales_h (u16) at 2, scales_l[4] at 4, qs[128] at 8.
// Sub-block ib (32 values) has the 6-bit scale ls = nibble ib of scales_l | 2 bits 2ib of
// scales_h << 4, and value[32ib + 16h + i] = d * (ls - 32) * kvalues[(qs[16ib + i] >> 4h) & 15]
// (IQ4_NL's table). (ggml dequantize_row_iq4_xs.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let ib = j >> 3u;
    let nib = (read_u32(bb + 8u + 16u * ib + 4u * (j & 3u)) >> (4u * ((j >> 2u) & 1u))) & 0x0f0f0f0fu;
    let lo = (read_u8(bb + 4u + (ib >> 1u)) >> (4u * (ib & 1u))) & 15u;
    let hi = (read_u16(bb + 2u) >> (2u * ib)) & 3u;
    return Parts4(lookup_kvalues_iq4nl(nib), read_f16(bb) * f32(i32(lo | (hi << 4u)) - 32), 0.0);
}
