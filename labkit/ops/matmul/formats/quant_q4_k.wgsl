// Q4_K: 256 values in 144 bytes: d (f16), dmin (f16), scales[12], qs[128].
// Eight 32-value sub-blocks, each with a 6-bit scale sc and min m (get_scale_min_k4).
// For 64-value chunk c (0..3) and l < 32, with q = qs[32c + l]:
//   value[64c + l]      = d * sc[2c]     * (q & 15) - dmin * m[2c]
//   value[64c + 32 + l] = d * sc[2c + 1] * (q >> 4) - dmin * m[2c + 1]
// (ggml dequantize_row_q4_K.) Block interface: see quant_f32.wgsl. The min's sign is a part,
// quant_q4_k_mins.wgsl (or a faulty one in its place), composed after this file.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

// ggml's get_scale_min_k4(is, scales): the 6-bit (scale, min) of sub-block is (0..7).
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
    let c = j >> 4u;             // 64-value chunk
    let hi = (j >> 3u) & 1u;     // second half of the chunk: high nibbles
    let l0 = 4u * (j & 7u);      // first of the 4 bytes within the chunk's 32
    let sm = scale_min_k4(bb, 2u * c + hi);
    let d = read_f16(bb) * sm.x;
    let m = read_f16(bb + 2u) * sm.y;
    let q = read_u32(bb + 16u + 32u * c + l0);
    let nib = (q >> (4u * hi)) & 0x0f0f0f0fu;
    return Parts4(bytes4(nib), d, q4_k_min(m));
}
