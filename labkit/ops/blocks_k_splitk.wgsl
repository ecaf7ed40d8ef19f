// Matmul driver for decode (T = 1) on Q4_K and Q5_K weights in the blocks layout, for real GPUs:
// the geometry is splitk_rows.wgsl's (64 threads share 4 rows), the chunk arithmetic
// blocks_k_dot.wgsl's. A thread's part is one 64-value chunk c of block k, for each of the 4
// rows: the block's scales texel, its 2 quant texels (and 5th-bit texels), and 64 values of X
// read once for the 4 rows.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let s = split_rows(wid.x + wid.y * nwg.x, P.K / 256u * BLOCK_TEXELS, BLOCK_TEXELS);
    if (!s.live) {
        return;  // uniform per workgroup
    }
    var acc = vec4<f32>();
    for (var i = li; i < P.K / 64u; i += SPLIT) {
        let o = (i / 4u) * QUAD * BLOCK_TEXELS;
        let c = i % 4u;
        let xl = x32_at(s.xb + 16u * i);
        let xh = x32_at(s.xb + 16u * i + 8u);
        let sums = vec2<f32>(x32_sum(xl), x32_sum(xh));
        acc += vec4<f32>(chunk_row(s.b0 + o, c, xl, xh, pick(scales(slot(s.b0 + o)), c), sums, qh(s.b0 + o)),
                         chunk_row(s.b1 + o, c, xl, xh, pick(scales(slot(s.b1 + o)), c), sums, qh(s.b1 + o)),
                         chunk_row(s.b2 + o, c, xl, xh, pick(scales(slot(s.b2 + o)), c), sums, qh(s.b2 + o)),
                         chunk_row(s.b3 + o, c, xl, xh, pick(scales(slot(s.b3 + o)), c), sums, qh(s.b3 + o)));
    }
    reduce_store(li, acc, s);
}
