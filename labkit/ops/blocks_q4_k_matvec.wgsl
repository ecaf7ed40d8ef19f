// Matmul driver for decode (T = 1) on Q4_K weights in the blocks layout (blocks_repack.wgsl):
// the GGUF blocks themselves, 144 bytes = 9 texels each, read with textureLoad. Near the
// format's own width (4.5 bits a weight), where the int8 layout takes 10. Same bindings and
// Params as matmul_matvec.wgsl; the geometry and X's sharing are quad_rows.wgsl's.
//
// A Q4_K block (ggml block_q4_K), as texels of 4 words:
//   texel 0       d, dmin (two f16 in word 0), the 12 bytes of 6-bit scales and mins
//   texels 1..8   qs[128]: 64-value chunk c lives in texels 1 + 2c and 2 + 2c;
//                 value 64c + l is the low nibble of its byte l, value 64c + 32 + l the high
//   value = d * sc[is] * q - dmin * m[is], is = 2c (low) or 2c + 1 (high)
// Each lane loads 4 of every 32 values of X and subgroupBroadcast shares them (as
// matmul_matvec.wgsl); a sub-block's sum of X serves the - dmin * m term of all 4 rows.
const BLOCK_TEXELS: u32 = 9u;
const LOW: u32 = 0x0f0f0f0fu;

fn x32_sum(x: X32) -> f32 {
    return dot(x.a + x.b + x.c + x.d + x.e + x.f + x.g + x.h, vec4<f32>(1.0));
}

// sum of x[l] * q[l] over 32 nibbles: bytes of texels t0 (l < 16) and t1, shifted by `shift`
fn nib_dot(x: X32, t0: vec4<u32>, t1: vec4<u32>, shift: u32) -> f32 {
    let a = dot(x.a, vec4<f32>(unpack4xU8((t0.x >> shift) & LOW))) + dot(x.b, vec4<f32>(unpack4xU8((t0.y >> shift) & LOW)));
    let b = dot(x.c, vec4<f32>(unpack4xU8((t0.z >> shift) & LOW))) + dot(x.d, vec4<f32>(unpack4xU8((t0.w >> shift) & LOW)));
    let c = dot(x.e, vec4<f32>(unpack4xU8((t1.x >> shift) & LOW))) + dot(x.f, vec4<f32>(unpack4xU8((t1.y >> shift) & LOW)));
    let d = dot(x.g, vec4<f32>(unpack4xU8((t1.z >> shift) & LOW))) + dot(x.h, vec4<f32>(unpack4xU8((t1.w >> shift) & LOW)));
    return (a + b) + (c + d);
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

// One row's sum over 64-value chunk c of a block at texel b, given its scales s (low/high sub-block).
fn chunk_row(b: u32, c: u32, xl: X32, xh: X32, sl: vec2<f32>, ml: vec2<f32>, sums: vec2<f32>) -> f32 {
    let t0 = slot(b + 1u + 2u * c);
    let t1 = slot(b + 2u + 2u * c);
    return sl.x * nib_dot(xl, t0, t1, 0u) + sl.y * nib_dot(xh, t0, t1, 4u) - dot(ml, sums);
}

fn pick(s: Scales, c: u32) -> vec4<f32> {  // (scale low, scale high, min low, min high) of chunk c
    let lo = select(s.s_hi, s.s_lo, c < 2u);
    let mo = select(s.m_hi, s.m_lo, c < 2u);
    let i = 2u * (c & 1u);
    return vec4<f32>(lo[i], lo[i + 1u], mo[i], mo[i + 1u]);
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let q = quad_rows(wid.x + wid.y * nwg.x, li, lane, P.K / 256u * BLOCK_TEXELS);
    if (!q.live) {
        return;  // uniform per workgroup
    }
    let b0 = q.b0;
    let b1 = q.b1;
    let b2 = q.b2;
    let b3 = q.b3;
    let xl0 = q.xl;
    let blocks = P.K / 256u;
    var acc = vec4<f32>();
    for (var k = 0u; k < blocks; k++) {
        let o = k * BLOCK_TEXELS;
        let s0 = scales(slot(b0 + o));
        let s1 = scales(slot(b1 + o));
        let s2 = scales(slot(b2 + o));
        let s3 = scales(slot(b3 + o));
        for (var c = 0u; c < 4u; c++) {
            let xi = xl0 + 64u * k + 16u * c;
            let xl = x32(X[xi]);
            let xh = x32(X[xi + 8u]);
            let sums = vec2<f32>(x32_sum(xl), x32_sum(xh));
            let p0 = pick(s0, c);
            let p1 = pick(s1, c);
            let p2 = pick(s2, c);
            let p3 = pick(s3, c);
            acc += vec4<f32>(chunk_row(b0 + o, c, xl, xh, p0.xy, p0.zw, sums), chunk_row(b1 + o, c, xl, xh, p1.xy, p1.zw, sums),
                             chunk_row(b2 + o, c, xl, xh, p2.xy, p2.zw, sums), chunk_row(b3 + o, c, xl, xh, p3.xy, p3.zw, sums));
        }
    }
    store4(q.t * P.y_stride + P.row0 + q.r, q.r, acc);
}
