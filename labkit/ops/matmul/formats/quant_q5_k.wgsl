// Q5_K: 256 values in 176 bytes: d (f16), dmin (f16), scales[12], qh[32], qs[128].
// As Q4_K, plus a 5th bit: for chunk c (0..3), l < 32, q = qs[32c + l], h = qh[l]:
//   value[64c + l]      = d * sc[2c]     * ((q & 15) + 16 * bit (2c)     of h) - dmin * m[2c]
//   value[64c + 32 + l] = d * sc[2c + 1] * ((q >> 4) + 16 * bit (2c + 1) of h) - dmin * m[2c + 1]
// (ggml dequantize_row_q5_K.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn scale_min_k4(bb: u32, is: u32) -> vec2<f32> {
    let s = bb + 4u;
    if (is < 4u) {
        return vec2<f32>(f32(read_u8(s + is) & 63u), f32(read_u8(s + is + 4u) & 63u));
    }
    let sc = (read_u8(s + is + 4u) & 0xfu) | ((read_u8(s + is - 4u) >> 6u) << 4u);
    let m = (read_u8(s + is + 4u) >> 4u) | ((read_u8(s + is) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn parts4(bb: u32, j: u32) -> Parts4 {
    let c = j >> 4u;
    let hi = (j >> 3u) & 1u;
    let l0 = 4u * (j & 7u);
    let is = 2u * c + hi;
    let sm = scale_min_k4(bb, is);
    let d = read_f16(bb) * sm.x;
    let m = read_f16(bb + 2u) * sm.y;
    let q = read_u32(bb + 48u + 32u * c + l0);
    let h = read_u32(bb + 16u + l0);
    let v = ((q >> (4u * hi)) & 0x0f0f0f0fu) | (((h >> is) & 0x01010101u) << 4u);
    return Parts4(bytes4(v), d, -m);
}
