// Matmul driver for prefill (T > 1) on Q6_K weights in the blocks layout (the block's texels:
// blocks_q6_k_matvec.wgsl): 8 rows x 16 tokens per thread (tile16.wgsl). Per half block each
// row's two high-bit texels, scales and d are read once (half_block), per 32-value quarter its
// two low-bit texels, and each word of 4 values is decoded for the 8 rows into two mat4x4 that
// serve all 16 tokens. Reading the scales and high bits once per half rather than per quarter:
// T = 64, 8192 x 2048, 61.9 -> 52.8 ms on lavapipe (Intel Xeon). A block's 2 halves are written
// out, not looped (llvmpipe keeps a loop's carried values under an execution mask): 53.5 -> 50.1 ms
// (Intel Xeon model 207, one run, alternating). So are a half's 4 quarters, each a call with a
// constant g (Mesa inlines it: the shifts by g fold): T = 64, 2048 x 8192, 64.4 -> 59.9 ms, and
// 8192 x 2048 63.2 -> 58.4; T = 128 141.8 -> 134.7 (AMD EPYC family 25, best of 18, alternating;
// bitwise the same output).
const BLOCK_TEXELS: u32 = 14u;

// The quarter's low-bit words (l0, l1, shifted), high-bit words (h0, h1) and its two scales
// (first and last 16 values), for one row.
struct Quarter { l0: vec4<u32>, l1: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, sc: vec2<f32>, off: vec2<f32> }

// What half n of the block at texel b shares among its quarters: its high-bit texels, and its
// scales times d (quarters 0, 1: scales 8n .. 8n + 3; quarters 2, 3: the next 4)
struct HalfBlock { h0: vec4<u32>, h1: vec4<u32>, lo: vec4<f32>, hi: vec4<f32> }

fn half_block(b: u32, n: u32) -> HalfBlock {
    let d = unpack2x16float(slot(b + 13u).x).x;
    let sw = slot(b + 12u);
    return HalfBlock(slot(b + 8u + 2u * n), slot(b + 9u + 2u * n), d * vec4<f32>(unpack4xI8(sw[2u * n])),
                     d * vec4<f32>(unpack4xI8(sw[2u * n + 1u])));
}

// quarter g of half n of the block at texel b
fn quarter_of(b: u32, n: u32, g: u32, half: HalfBlock) -> Quarter {
    let shift = vec4<u32>(4u * (g >> 1u));
    let l = b + 4u * n + 2u * (g & 1u);
    let sc = select(half.hi, half.lo, g < 2u);
    let i = 2u * (g & 1u);
    let scale = vec2<f32>(sc[i], sc[i + 1u]);
    return Quarter(slot(l) >> shift, slot(l + 1u) >> shift, half.h0, half.h1, scale, -32.0 * scale);
}

// one row's 4 values of word i of quarter g: scale * (q - 32) as one fma
fn col(q: Quarter, i: u32, g: u32) -> vec4<f32> {
    let first = i < 4u;
    let lo = select(q.l1[i - 4u], q.l0[i], first);
    let hi = select(q.h1[i - 4u], q.h0[i], first);
    let u = (lo & 0x0f0f0f0fu) | (((hi >> (2u * g)) & 0x03030303u) << 4u);
    return fma(vec4<f32>(unpack4xU8(u)), vec4<f32>(select(q.sc.y, q.sc.x, first)), vec4<f32>(select(q.off.y, q.off.x, first)));
}

// Quarter g of half n of block k (texel offset o) for the 8 rows into the tile: each word of 4
// values for the 8 rows.
fn quarter_tiles(acc: ptr<function, array<vec4<f32>, 32>>, t: Tile, base: array<u32, 8>, o: u32, w0: u32, n: u32, g: u32,
                 hs: array<HalfBlock, 8>) {
    let a0 = quarter_of(base[0] + o, n, g, hs[0]); let a1 = quarter_of(base[1] + o, n, g, hs[1]);
    let a2 = quarter_of(base[2] + o, n, g, hs[2]); let a3 = quarter_of(base[3] + o, n, g, hs[3]);
    let a4 = quarter_of(base[4] + o, n, g, hs[4]); let a5 = quarter_of(base[5] + o, n, g, hs[5]);
    let a6 = quarter_of(base[6] + o, n, g, hs[6]); let a7 = quarter_of(base[7] + o, n, g, hs[7]);
    for (var i = 0u; i < 8u; i++) {
        let ma = mat4x4<f32>(col(a0, i, g), col(a1, i, g), col(a2, i, g), col(a3, i, g));
        let mb = mat4x4<f32>(col(a4, i, g), col(a5, i, g), col(a6, i, g), col(a7, i, g));
        tile_step(acc, t, w0 + 8u * g + i, ma, mb);
    }
}

// The 8 rows' half n of block k into the tile: its 4 quarters written out, not looped (see the header).
fn half_tiles(acc: ptr<function, array<vec4<f32>, 32>>, t: Tile, base: array<u32, 8>, k: u32, n: u32) {
    let o = k * QUAD * BLOCK_TEXELS;
    var hs: array<HalfBlock, 8>;
    for (var j = 0u; j < 8u; j++) {
        hs[j] = half_block(base[j] + o, n);
    }
    let w0 = 64u * k + 32u * n;
    quarter_tiles(acc, t, base, o, w0, n, 0u, hs);
    quarter_tiles(acc, t, base, o, w0, n, 1u, hs);
    quarter_tiles(acc, t, base, o, w0, n, 2u, hs);
    quarter_tiles(acc, t, base, o, w0, n, 3u, hs);
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
        half_tiles(&acc, t, base, k, 0u);  // the 2 halves written out, not looped (see the header)
        half_tiles(&acc, t, base, k, 1u);
    }
    tile_store(&acc, t);
}
