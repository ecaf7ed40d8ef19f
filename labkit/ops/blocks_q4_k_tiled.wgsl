// Matmul driver for prefill (T > 1) on Q4_K weights in the blocks layout (the block's texels:
// blocks_q4_k_matvec.wgsl): 8 rows x 16 tokens per thread (tile16.wgsl). Per 64-value chunk
// each row's two quant texels and its header are read once, and each word of 4 values is
// decoded for the 8 rows into two mat4x4 that serve all 16 tokens.
const BLOCK_TEXELS: u32 = 9u;
const LOW: u32 = 0x0f0f0f0fu;

// (d * sc, dmin * m) of sub-block `is` from a block's header texel (ggml get_scale_min_k4)
fn scale_min(h: vec4<u32>, is: u32) -> vec2<f32> {
    let dd = unpack2x16float(h.x);
    let j = is & 3u;
    let lo = (vec2<u32>(h.y, h.z) >> vec2<u32>(8u * j)) & vec2<u32>(0xffu);
    let hi = (h.w >> (8u * j)) & 0xffu;
    var sm = lo & vec2<u32>(63u);
    if (is >= 4u) {
        sm = vec2<u32>(hi & 15u, hi >> 4u) | ((lo >> vec2<u32>(6u)) << vec2<u32>(4u));
    }
    return dd * vec2<f32>(sm);
}

// row j's 4 values of word i of the chunk half (nibbles shifted by `shift`) with its scale and min
fn col(t0: vec4<u32>, t1: vec4<u32>, i: u32, shift: u32, sm: vec2<f32>) -> vec4<f32> {
    let u = select(t1[i - 4u], t0[i], i < 4u);
    return sm.x * vec4<f32>(unpack4xU8((u >> shift) & LOW)) - sm.y;
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_of(wid.x + wid.y * nwg.x, li, lane);
    if (!t.live) {
        return;
    }
    let row_texels = P.K / 256u * BLOCK_TEXELS;
    var base: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) {
        base[j] = tile_row(t, j) * row_texels;
    }
    var acc: array<vec4<f32>, 32>;
    for (var k = 0u; k < P.K / 256u; k++) {
        for (var c = 0u; c < 4u; c++) {
            var q0: array<vec4<u32>, 8>;
            var q1: array<vec4<u32>, 8>;
            var h: array<vec4<u32>, 8>;
            for (var j = 0u; j < 8u; j++) {
                let b = base[j] + k * BLOCK_TEXELS;
                h[j] = slot(b);
                q0[j] = slot(b + 1u + 2u * c);
                q1[j] = slot(b + 2u + 2u * c);
            }
            for (var half = 0u; half < 2u; half++) {
                let is = 2u * c + half;
                let s0 = scale_min(h[0], is); let s1 = scale_min(h[1], is);
                let s2 = scale_min(h[2], is); let s3 = scale_min(h[3], is);
                let s4 = scale_min(h[4], is); let s5 = scale_min(h[5], is);
                let s6 = scale_min(h[6], is); let s7 = scale_min(h[7], is);
                let shift = 4u * half;
                for (var i = 0u; i < 8u; i++) {
                    let ma = mat4x4<f32>(col(q0[0], q1[0], i, shift, s0), col(q0[1], q1[1], i, shift, s1),
                                         col(q0[2], q1[2], i, shift, s2), col(q0[3], q1[3], i, shift, s3));
                    let mb = mat4x4<f32>(col(q0[4], q1[4], i, shift, s4), col(q0[5], q1[5], i, shift, s5),
                                         col(q0[6], q1[6], i, shift, s6), col(q0[7], q1[7], i, shift, s7));
                    tile_step(&acc, t, 64u * k + 16u * c + 8u * half + i, ma, mb);
                }
            }
        }
    }
    tile_store(&acc, t);
}
