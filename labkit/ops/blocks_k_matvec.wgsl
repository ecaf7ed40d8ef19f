// Matmul driver for decode (T = 1) on Q4_K and Q5_K weights in the blocks layout: the GGUF
// blocks themselves in texels, read with textureLoad (the format's file, blocks_q4_k.wgsl or
// blocks_q5_k.wgsl, composed before this one, says where each field lives). Same bindings and
// Params as matmul_matvec.wgsl; the geometry and X's sharing are quad_rows.wgsl's.
// Each lane loads 4 of every 32 values of X and subgroupBroadcast shares them (as
// matmul_matvec.wgsl); a sub-block's sum of X serves the - dmin * m term of all 4 rows.
// The chunk arithmetic is blocks_k_dot.wgsl's.
@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let q = quad_rows(wid.x + wid.y * nwg.x, li, lane, P.K / 256u * BLOCK_TEXELS, BLOCK_TEXELS);
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
        let o = k * QUAD * BLOCK_TEXELS;
        let s0 = scales(slot(b0 + o));
        let s1 = scales(slot(b1 + o));
        let s2 = scales(slot(b2 + o));
        let s3 = scales(slot(b3 + o));
        let h0 = qh(b0 + o);
        let h1 = qh(b1 + o);
        let h2 = qh(b2 + o);
        let h3 = qh(b3 + o);
        for (var c = 0u; c < 4u; c++) {
            let xi = xl0 + 64u * k + 16u * c;
            let xl = x32(X[xi] * BYTE_PLACE);
            let xh = x32(X[xi + 8u] * BYTE_PLACE);
            let sums = vec2<f32>(x32_sum(xl), x32_sum(xh));
            acc += vec4<f32>(chunk_row(b0 + o, c, xl, xh, pick(s0, c), sums, h0),
                             chunk_row(b1 + o, c, xl, xh, pick(s1, c), sums, h1),
                             chunk_row(b2 + o, c, xl, xh, pick(s2, c), sums, h2),
                             chunk_row(b3 + o, c, xl, xh, pick(s3, c), sums, h3));
        }
    }
    store4(q.t * P.y_stride + P.row0 + q.r, q.r, acc);
}
