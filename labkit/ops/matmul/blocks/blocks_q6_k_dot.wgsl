// What the decode drivers on Q6_K blocks share (blocks_q6_k_matvec.wgsl, blocks_q6_k_splitk.wgsl):
// the layout and one row's sum over a 32-value quarter, given Vec8 (lanes8.wgsl).
//
// A Q6_K block (ggml block_q6_K), as texels of 4 words:
//   texels 0..7    ql[128]: half n's ql[64n ..] in texels 4n .. 4n + 3
//   texels 8..11   qh[64]: half n's qh[32n ..] in texels 8 + 2n, 9 + 2n
//   texel 12       scales[16], int8
//   texel 13       d (f16, word 0)
//   for half n, quarter g, l < 32: q = low 4 bits of ql[64n + 32(g & 1) + l] (high nibble when
//   g >= 2) | ((qh[32n + l] >> 2g) & 3) << 4;  value = d * scales[8n + 2g + l / 16] * (q - 32)
const BLOCK_TEXELS: u32 = 14u;

// the 6-bit quants of quarter g, in place, from its low-bit word `lo` (already shifted) and high-bit word `hi`
fn q4(lo: u32, hi: u32, g: u32) -> vec4<f32> {
    return in_place((lo & 0x0f0f0f0fu) | (((hi >> (2u * g)) & 0x03030303u) << 4u));
}

// A block's 16 scales times d: half n's quarters 0, 1 (scales 8n .. 8n + 3) and 2, 3 (8n + 4 ..).
// Read once per block: its texels 12 and 13 serve both halves.
struct Scales6 { lo0: vec4<f32>, hi0: vec4<f32>, lo1: vec4<f32>, hi1: vec4<f32> }

fn scales6(b: u32) -> Scales6 {
    let d = unpack2x16float(slot(b + 13u).x).x;
    let sw = slot(b + 12u);
    return Scales6(d * vec4<f32>(unpack4xI8(sw.x)), d * vec4<f32>(unpack4xI8(sw.y)),
                   d * vec4<f32>(unpack4xI8(sw.z)), d * vec4<f32>(unpack4xI8(sw.w)));
}

// half n's (quarters 0, 1 scales, quarters 2, 3 scales)
fn half_scales(s: Scales6, n: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(select(s.lo1, s.lo0, n == 0u), select(s.hi1, s.hi0, n == 0u));
}

// One row's sum over quarter g, from the half's low-bit texels (l0, l1: already picked and
// shifted for g) and high-bit texels (h0, h1), with the quarter's two scales and 16-value X sums;
// x is placed (byte_place.wgsl).
fn quarter(x: Vec8, l0: vec4<u32>, l1: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, g: u32, sc: vec2<f32>) -> f32 {
    let first = dot(x.a, q4(l0.x, h0.x, g)) + dot(x.b, q4(l0.y, h0.y, g)) + dot(x.c, q4(l0.z, h0.z, g)) + dot(x.d, q4(l0.w, h0.w, g));
    let last = dot(x.e, q4(l1.x, h1.x, g)) + dot(x.f, q4(l1.y, h1.y, g)) + dot(x.g, q4(l1.z, h1.z, g)) + dot(x.h, q4(l1.w, h1.w, g));
    let s1 = dot(x.a + x.b + x.c + x.d, BYTE_VALUE);
    let s2 = dot(x.e + x.f + x.g + x.h, BYTE_VALUE);
    return dot(sc, vec2<f32>(first, last) - 32.0 * vec2<f32>(s1, s2));
}

