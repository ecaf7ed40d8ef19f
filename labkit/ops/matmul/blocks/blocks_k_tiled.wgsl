// Matmul driver for prefill (T > 1) on Q4_K and Q5_K weights in the blocks layout (the format's
// file, blocks_q4_k.wgsl or blocks_q5_k.wgsl, composed before this one, says where each field
// lives): 8 rows x 16 tokens per thread (tile16.wgsl). Per block each row's header is read once,
// per 64-value chunk its two quant texels and its 5th bits, and each word of 4 values is decoded
// for the 8 rows into two mat4x4 that serve all 16 tokens. A chunk's 2 sub-blocks are written out,
// not looped (llvmpipe keeps a loop's carried values under an execution mask): T = 64, 8192 x 2048,
// 46.1 -> 43.2 ms on lavapipe (Intel Xeon model 207, one run, alternating).
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

// A row's texels for one 64-value chunk: its quants (q0, q1), header, and 5th bits (h0, h1: zero
// for Q4_K).
struct Chunk { q0: vec4<u32>, q1: vec4<u32>, head: vec4<u32>, h0: vec4<u32>, h1: vec4<u32> }

fn chunk_of(b: u32, c: u32, head: vec4<u32>) -> Chunk {
    var out = Chunk(slot(b + QS_TEXEL + 2u * c), slot(b + QS_TEXEL + 1u + 2u * c), head, vec4<u32>(), vec4<u32>());
    if (HAS_QH) {
        out.h0 = slot(b + 1u);
        out.h1 = slot(b + 2u);
    }
    return out;
}

// a row's 4 values of word i of sub-block `is` (the chunk's low nibbles when is is even) with
// its scale and min
fn col(r: Chunk, i: u32, is: u32, sm: vec2<f32>) -> vec4<f32> {
    let first = i < 4u;
    let u = select(r.q1[i - 4u], r.q0[i], first) >> (4u * (is & 1u));
    let h = select(r.h1[i - 4u], r.h0[i], first) >> is;
    return sm.x * vec4<f32>(unpack4xU8((u & LOW) | ((h & 0x01010101u) << 4u))) - sm.y;
}

// The 8 rows' sub-block `is` (a chunk's low or high nibbles) into the tile; w0: its first word of X.
fn sub_block_tiles(acc: ptr<function, array<vec4<f32>, 32>>, t: Tile, r: array<Chunk, 8>, is: u32, w0: u32) {
    let s0 = scale_min(r[0].head, is); let s1 = scale_min(r[1].head, is);
    let s2 = scale_min(r[2].head, is); let s3 = scale_min(r[3].head, is);
    let s4 = scale_min(r[4].head, is); let s5 = scale_min(r[5].head, is);
    let s6 = scale_min(r[6].head, is); let s7 = scale_min(r[7].head, is);
    for (var i = 0u; i < 8u; i++) {
        let ma = mat4x4<f32>(col(r[0], i, is, s0), col(r[1], i, is, s1), col(r[2], i, is, s2), col(r[3], i, is, s3));
        let mb = mat4x4<f32>(col(r[4], i, is, s4), col(r[5], i, is, s5), col(r[6], i, is, s6), col(r[7], i, is, s7));
        tile_step(acc, t, w0 + i, ma, mb);
    }
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
        base[j] = row_start(tile_row(t, j), row_texels, BLOCK_TEXELS);
    }
    var acc: array<vec4<f32>, 32>;
    for (var k = 0u; k < P.K / 256u; k++) {
        let o = k * QUAD * BLOCK_TEXELS;
        var head: array<vec4<u32>, 8>;  // each row's header texel, read once per block
        for (var j = 0u; j < 8u; j++) {
            head[j] = slot(base[j] + o);
        }
        for (var c = 0u; c < 4u; c++) {
            let r0 = chunk_of(base[0] + o, c, head[0]); let r1 = chunk_of(base[1] + o, c, head[1]);
            let r2 = chunk_of(base[2] + o, c, head[2]); let r3 = chunk_of(base[3] + o, c, head[3]);
            let r4 = chunk_of(base[4] + o, c, head[4]); let r5 = chunk_of(base[5] + o, c, head[5]);
            let r6 = chunk_of(base[6] + o, c, head[6]); let r7 = chunk_of(base[7] + o, c, head[7]);
            let rs = array<Chunk, 8>(r0, r1, r2, r3, r4, r5, r6, r7);
            sub_block_tiles(&acc, t, rs, 2u * c, 64u * k + 16u * c);  // the 2 halves written out (see the header)
            sub_block_tiles(&acc, t, rs, 2u * c + 1u, 64u * k + 16u * c + 8u);
        }
    }
    tile_store(&acc, t);
}
