// Matmul driver for prefill (T > 1) on the legacy formats in grouped blocks (blocks_group.wgsl, and
// the format's file, composed before this one): 8 rows x 16 tokens per thread (tile16.wgsl). Per
// block each row's quant texels are read once, its group's other fields once per 8 blocks, and each
// word of 4 values is decoded for the 8 rows into two mat4x4 that serve all 16 tokens.

fn col(b: Block, w: u32) -> vec4<f32> {
    return b.scale * word(b, w) + b.offset;
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_of(wid.x + wid.y * nwg.x, li, lane);
    if (!t.live) {
        return;
    }
    let rt = row_texels(P.K);
    var base: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) {
        base[j] = row_start(tile_row(t, j), rt, GROUP_TEXELS);
    }
    let blocks = P.K / BLOCK_VALUES;
    let groups = (blocks + GROUP_BLOCKS - 1u) / GROUP_BLOCKS;
    var acc: array<vec4<f32>, 32>;
    for (var gi = 0u; gi < groups; gi++) {
        let o = gi * QUAD * GROUP_TEXELS;
        let a0 = aux_of(base[0] + o); let a1 = aux_of(base[1] + o);
        let a2 = aux_of(base[2] + o); let a3 = aux_of(base[3] + o);
        let a4 = aux_of(base[4] + o); let a5 = aux_of(base[5] + o);
        let a6 = aux_of(base[6] + o); let a7 = aux_of(base[7] + o);
        let n = min(GROUP_BLOCKS, blocks - gi * GROUP_BLOCKS);
        for (var i = 0u; i < n; i++) {
            let r0 = block_at(base[0] + o, i, a0); let r1 = block_at(base[1] + o, i, a1);
            let r2 = block_at(base[2] + o, i, a2); let r3 = block_at(base[3] + o, i, a3);
            let r4 = block_at(base[4] + o, i, a4); let r5 = block_at(base[5] + o, i, a5);
            let r6 = block_at(base[6] + o, i, a6); let r7 = block_at(base[7] + o, i, a7);
            let w0 = 8u * (gi * GROUP_BLOCKS + i);  // the block's first word of X
            for (var w = 0u; w < 8u; w++) {
                let ma = mat4x4<f32>(col(r0, w), col(r1, w), col(r2, w), col(r3, w));
                let mb = mat4x4<f32>(col(r4, w), col(r5, w), col(r6, w), col(r7, w));
                tile_step(&acc, t, w0 + w, ma, mb);
            }
        }
    }
    tile_store(&acc, t);
}
