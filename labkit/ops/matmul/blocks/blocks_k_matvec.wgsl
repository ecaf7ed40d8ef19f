// Matmul driver for decode (T = 1) on Q4_K and Q5_K weights in the blocks layout: the GGUF
// blocks themselves in texels, read with textureLoad (the format's file, blocks_q4_k.wgsl or
// blocks_q5_k.wgsl, composed before this one, says where each field lives). Params as
// matmul_matvec.wgsl's; X (a texture), the geometry and X's sharing are quad_rows.wgsl's.
// Each lane loads 4 of every 32 values of X and subgroupBroadcast shares them (as
// matmul_matvec.wgsl); a sub-block's sum of X serves the - dmin * m term of all 8 rows.
// The chunk arithmetic is blocks_k_dot.wgsl's.
// A block's 4 chunks are written out, not a loop over c: llvmpipe keeps a loop's carried values
// under an execution mask, a masked store per value per turn, and a constant c folds pick() and
// the texel offsets. Measured on lavapipe (2 cores, Intel Xeon model 207, one run, alternating):
// 4.23 -> 4.75 GB/s at 14336 x 4096, 3.90 -> 4.32 at 8192 x 2048; unrolling k as well was slower.
// A thread owns two quads (8 rows), so a chunk's X loads, broadcasts and sums serve 8 rows, not 4:
// 4.78 -> 5.22 GB/s at 4096 x 4096, 3.99 -> 4.30 at 2048 x 2048, 4.27 -> 4.68 at 1024 x 4096.

// A block's scales and 5th bits for each of a quad's 4 rows, read once per block.
struct QuadBlock { s0: Scales, s1: Scales, s2: Scales, s3: Scales,
                   h0: array<vec4<u32>, 2>, h1: array<vec4<u32>, 2>, h2: array<vec4<u32>, 2>, h3: array<vec4<u32>, 2> }

fn quad_block(q: QuadRows, o: u32) -> QuadBlock {
    return QuadBlock(scales(slot(q.b0 + o)), scales(slot(q.b1 + o)), scales(slot(q.b2 + o)), scales(slot(q.b3 + o)),
                     qh(q.b0 + o), qh(q.b1 + o), qh(q.b2 + o), qh(q.b3 + o));
}

const ROWS_PER_THREAD: u32 = 8u;  // two quads: X's loads, broadcasts and sums serve 8 rows
const ROWS_PER_WG: u32 = 128u;  // 16 threads x ROWS_PER_THREAD: as many workgroups as with one quad
// a thread, so a 640-row weight keeps 5 (with 32 threads, 3: 640 x 2048 0.22 -> 0.31 ms)

// One quad's 4 sums over 64-value chunk c of the block at texel offset o, given the chunk's X
// (xl, xh) and its two 32-value sums.
fn chunk_quad(q: QuadRows, o: u32, c: u32, xl: Vec8, xh: Vec8, sums: vec2<f32>, qb: QuadBlock) -> vec4<f32> {
    return vec4<f32>(chunk_row(q.b0 + o, c, xl, xh, pick(qb.s0, c), sums, qb.h0),
                     chunk_row(q.b1 + o, c, xl, xh, pick(qb.s1, c), sums, qb.h1),
                     chunk_row(q.b2 + o, c, xl, xh, pick(qb.s2, c), sums, qb.h2),
                     chunk_row(q.b3 + o, c, xl, xh, pick(qb.s3, c), sums, qb.h3));
}

// Both quads' sums over chunk c into acc; xi: the chunk's first vec4 of X.
fn chunk_quads(acc: ptr<function, array<vec4<f32>, 2>>, q: array<QuadRows, 2>, o: u32, c: u32, xi: u32,
               qb: array<QuadBlock, 2>) {
    let xl = broadcast8(x_lane(q[0], xi) * BYTE_PLACE);
    let xh = broadcast8(x_lane(q[0], xi + 8u) * BYTE_PLACE);
    let sums = vec2<f32>(x32_sum(xl), x32_sum(xh));
    (*acc)[0] += chunk_quad(q[0], o, c, xl, xh, sums, qb[0]);
    (*acc)[1] += chunk_quad(q[1], o, c, xl, xh, sums, qb[1]);
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let row_texels = P.K / 256u * BLOCK_TEXELS;
    let first = quad_rows(wid.x + wid.y * nwg.x, li, lane, row_texels, BLOCK_TEXELS);
    if (!first.live) {
        return;  // uniform per workgroup
    }
    let q = array<QuadRows, 2>(first, next_quad(first, row_texels, BLOCK_TEXELS));
    var acc: array<vec4<f32>, 2>;
    for (var k = 0u; k < P.K / 256u; k++) {
        let o = k * QUAD * BLOCK_TEXELS;
        let qb = array<QuadBlock, 2>(quad_block(q[0], o), quad_block(q[1], o));
        let xi = 64u * k;
        // the 4 chunks written out, not looped (see the header)
        chunk_quads(&acc, q, o, 0u, xi, qb);
        chunk_quads(&acc, q, o, 1u, xi + 16u, qb);
        chunk_quads(&acc, q, o, 2u, xi + 32u, qb);
        chunk_quads(&acc, q, o, 3u, xi + 48u, qb);
    }
    let y = first.t * P.y_stride + P.row0;
    store4(y + q[0].r, q[0].r, acc[0]);
    store4(y + q[1].r, q[1].r, acc[1]);
}
