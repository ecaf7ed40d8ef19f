// Matmul driver for decode (T = 1) on the legacy formats in grouped blocks (blocks_group.wgsl, and
// the format's file, composed before this one): Params as matmul_matvec.wgsl's; X (a texture), the
// geometry and X's sharing are quad_rows.wgsl's. A block is 32 values: lane l loads values 4l .. 4l + 3
// and subgroupBroadcast hands all 32 to every lane; each of a thread's 4 rows reads its block's
// quant texels once, and its group's other fields once per 8 blocks.

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 128u;  // 32 threads x ROWS_PER_THREAD

// one row's block against the block's 32 values of X (sx: their sum, for the offset)
fn block_dot(b: Block, x: Vec8, sx: f32) -> f32 {
    let lo = dot(x.a, word(b, 0u)) + dot(x.b, word(b, 1u)) + dot(x.c, word(b, 2u)) + dot(x.d, word(b, 3u));
    let hi = dot(x.e, word(b, 4u)) + dot(x.f, word(b, 5u)) + dot(x.g, word(b, 6u)) + dot(x.h, word(b, 7u));
    return b.scale * (lo + hi) + b.offset * sx;
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let q = quad_rows(wid.x + wid.y * nwg.x, li, lane, row_texels(P.K), GROUP_TEXELS);
    if (!q.live) {
        return;  // uniform per workgroup
    }
    let blocks = P.K / BLOCK_VALUES;
    let groups = (blocks + GROUP_BLOCKS - 1u) / GROUP_BLOCKS;
    var acc = vec4<f32>();
    for (var gi = 0u; gi < groups; gi++) {
        let o = gi * QUAD * GROUP_TEXELS;
        let a0 = aux_of(q.b0 + o);
        let a1 = aux_of(q.b1 + o);
        let a2 = aux_of(q.b2 + o);
        let a3 = aux_of(q.b3 + o);
        let n = min(GROUP_BLOCKS, blocks - gi * GROUP_BLOCKS);  // the last group may hold fewer
        for (var i = 0u; i < n; i++) {
            let x = broadcast8(x_lane(q, 8u * (gi * GROUP_BLOCKS + i)));
            let sx = dot(x.a + x.b + x.c + x.d + x.e + x.f + x.g + x.h, vec4<f32>(1.0));
            acc += vec4<f32>(block_dot(block_at(q.b0 + o, i, a0), x, sx), block_dot(block_at(q.b1 + o, i, a1), x, sx),
                             block_dot(block_at(q.b2 + o, i, a2), x, sx), block_dot(block_at(q.b3 + o, i, a3), x, sx));
        }
    }
    store4(q.t * P.y_stride + P.row0 + q.r, q.r, acc);
}
