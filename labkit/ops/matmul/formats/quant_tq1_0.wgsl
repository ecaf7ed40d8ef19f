// TQ1_0: 256 ternary values in 54 bytes: qs[48], qh[4] at 48, d (f16) at 52. Each byte holds 5
// (qh: 4) base-3 digits, most significant first: digit p of byte b is ((b * 3^p) & 255) * 3 >> 8.
// Values 0..159 are digit v / 32 of qs[v % 32], 160..239 digit (v - 160) / 16 of qs[32 + v % 16],
// 240..255 digit (v - 240) / 4 of qh[v % 4]. value = d * (digit - 1).
// (ggml dequantize_row_tq1_0.) Block interface: see quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 54u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 256u;

// digit p (0..4) of each of the 4 bytes of q, as 0, 1 or 2
fn trits4(q: u32, p: u32) -> vec4<f32> {
    var pow3 = 1u;
    for (var i = 0u; i < p; i++) {
        pow3 *= 3u;
    }
    let b = (unpack4xU8(q) * pow3) & vec4<u32>(255u);
    return vec4<f32>((b * 3u) >> vec4<u32>(8u));
}

fn parts4(bb: u32, j: u32) -> Parts4 {
    var at = 4u * (j & 7u);  // qs[0..32): digits 0..4, 8 words each
    var p = j >> 3u;
    if (j >= 60u) {  // qh: digits 0..3 of one word
        at = 48u;
        p = j - 60u;
    } else if (j >= 40u) {  // qs[32..48): digits 0..4, 4 words each
        at = 32u + 4u * ((j - 40u) & 3u);
        p = (j - 40u) >> 2u;
    }
    return Parts4(trits4(read_u32(bb + at), p) - 1.0, read_f16(bb + 52u), 0.0);
}
