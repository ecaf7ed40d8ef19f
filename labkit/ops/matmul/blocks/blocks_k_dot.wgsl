// What the decode drivers on Q4_K and Q5_K blocks share (blocks_k_matvec.wgsl, blocks_k_splitk.wgsl):
// one row's sum over a 64-value chunk of a block, given 32 + 32 values of X (Vec8, of lanes8.wgsl,
// placed by byte_place.wgsl), and the block's scales and 5th bits.
const LOW: u32 = 0x0f0f0f0fu;

fn x32_sum(x: Vec8) -> f32 {
    return dot(x.a + x.b + x.c + x.d + x.e + x.f + x.g + x.h, BYTE_VALUE);  // x is placed
}

// 4 quants in place: the nibbles of word u (shifted by `shift`), with bit `is` of the qh word h as 5th bit
fn q5(u: u32, h: u32, shift: u32, is: u32) -> vec4<f32> {
    return in_place(((u >> shift) & LOW) | (((h >> is) & 0x01010101u) << 4u));
}

// sum of x[l] * q[l] over 32 quants: nibbles of texels t0 (l < 16) and t1, 5th bits from h0, h1
fn nib_dot(x: Vec8, t0: vec4<u32>, t1: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, shift: u32, is: u32) -> f32 {
    let a = dot(x.a, q5(t0.x, h0.x, shift, is)) + dot(x.b, q5(t0.y, h0.y, shift, is));
    let b = dot(x.c, q5(t0.z, h0.z, shift, is)) + dot(x.d, q5(t0.w, h0.w, shift, is));
    let c = dot(x.e, q5(t1.x, h1.x, shift, is)) + dot(x.f, q5(t1.y, h1.y, shift, is));
    let d = dot(x.g, q5(t1.z, h1.z, shift, is)) + dot(x.h, q5(t1.w, h1.w, shift, is));
    return (a + b) + (c + d);
}

// the block's 5th bits (texels 1 and 2), zero for a format without them
fn qh(b: u32) -> array<vec4<u32>, 2> {
    var h: array<vec4<u32>, 2>;
    if (HAS_QH) {
        h[0] = slot(b + 1u);
        h[1] = slot(b + 2u);
    }
    return h;
}

// A block's scales: d * sc and dmin * m of its 8 sub-blocks (ggml get_scale_min_k4).
struct Scales { s_lo: vec4<f32>, s_hi: vec4<f32>, m_lo: vec4<f32>, m_hi: vec4<f32> }

fn scales(h: vec4<u32>) -> Scales {
    let dd = unpack2x16float(h.x);
    let sc_lo = unpack4xU8(h.y & 0x3f3f3f3fu);
    let m_lo = unpack4xU8(h.z & 0x3f3f3f3fu);
    let sc_hi = unpack4xU8((h.w & LOW) | ((h.y >> 2u) & 0x30303030u));
    let m_hi = unpack4xU8(((h.w >> 4u) & LOW) | ((h.z >> 2u) & 0x30303030u));
    return Scales(dd.x * vec4<f32>(sc_lo), dd.x * vec4<f32>(sc_hi), dd.y * vec4<f32>(m_lo), dd.y * vec4<f32>(m_hi));
}

// One row's sum over 64-value chunk c of a block at texel b, given p = pick(its scales, c): the low and high
// sub-blocks' scales and mins; sums: the chunk's two 32-value sums of X.
// h: the block's 5th bits (qh)
fn chunk_row(b: u32, c: u32, xl: Vec8, xh: Vec8, p: vec4<f32>, sums: vec2<f32>, h: array<vec4<u32>, 2>) -> f32 {
    let t0 = slot(b + QS_TEXEL + 2u * c);
    let t1 = slot(b + QS_TEXEL + 1u + 2u * c);
    let lo = nib_dot(xl, t0, t1, h[0], h[1], 0u, 2u * c);
    let hi = nib_dot(xh, t0, t1, h[0], h[1], 4u, 2u * c + 1u);
    return p.x * lo + p.y * hi - dot(p.zw, sums);
}

fn pick(s: Scales, c: u32) -> vec4<f32> {  // (scale low, scale high, min low, min high) of chunk c
    let lo = select(s.s_hi, s.s_lo, c < 2u);
    let mo = select(s.m_hi, s.m_lo, c < 2u);
    let i = 2u * (c & 1u);
    return vec4<f32>(lo[i], lo[i + 1u], mo[i], mo[i + 1u]);
}

