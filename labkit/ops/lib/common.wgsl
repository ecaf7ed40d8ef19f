// Safe readers over the raw GGUF bytes of a weight window, `W: array<u32>` (declared by the
// driver that this file is composed with). Offsets are byte offsets into the window.
// GGUF blocks are packed back to back: Q8_0 (34 B), Q5_0 (22 B), Q4_0 (18 B) and Q6_K
// (210 B) blocks are only 2-byte aligned, so a u16 or u32 field can straddle two words.
// Little-endian throughout, as in the file.

// One byte, zero-extended.
fn read_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// One byte, sign-extended (int8 quants and Q6_K scales).
fn read_i8(b: u32) -> i32 {
    return bitcast<i32>(read_u8(b) << 24u) >> 24u;
}

// Four bytes starting at any byte offset b (straddles two words unless b % 4 == 0).
// Only the words holding bytes b..b+3 are read.
fn read_u32(b: u32) -> u32 {
    let w = b >> 2u;
    let s = (b & 3u) * 8u;
    let lo = W[w];
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (W[w + 1u] << (32u - s));
}

// Two bytes at any byte offset b (straddles only when b % 4 == 3).
fn read_u16(b: u32) -> u32 {
    let s = (b & 3u) * 8u;
    if (s <= 16u) {
        return (W[b >> 2u] >> s) & 0xffffu;
    }
    return read_u32(b) & 0xffffu;
}

// An IEEE half at byte offset b, as f32 (exact; no shader-f16 needed).
fn read_f16(b: u32) -> f32 {
    return unpack2x16float(read_u16(b)).x;
}

// The four bytes of a u32 as unsigned values.
fn bytes4(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(q));
}

// The four bytes of a u32 as signed int8 values.
fn ibytes4(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(q));
}

// Bits 0..3 of h moved to bit 4 of bytes 0..3: a 5-bit format's high bits (Q5_0, Q5_1).
fn spread4(h: u32) -> u32 {
    return ((h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u)) << 4u;
}

// Bits 0..3 of `bits` as the signs of 4 values: +1 where clear, -1 where set (the I-quants).
fn signs4(bits: u32) -> vec4<f32> {
    let b = vec4<u32>(bits, bits >> 1u, bits >> 2u, bits >> 3u) & vec4<u32>(1u);
    return 1.0 - 2.0 * vec4<f32>(b);
}

// Values 4j..4j+3 of a block, as the format's parts4 gives them: scale * q + offset.
struct Parts4 {
    q: vec4<f32>,
    scale: f32,
    offset: f32,
}

fn dequant4(bb: u32, j: u32) -> vec4<f32> {
    let p = parts4(bb, j);
    return p.scale * p.q + p.offset;
}
