// Matmul driver for decode (T = 1) on Q4_K and Q5_K weights in the blocks layout, for real GPUs:
// the geometry and the entry point are splitk_rows.wgsl's (64 threads share 4 rows), the chunk
// arithmetic blocks_k_dot.wgsl's. A thread's part is one 64-value chunk c of block k, for each of
// the 4 rows: the block's scales texel, its 2 quant texels (and 5th-bit texels), and 64 values of
// X read once for the 4 rows.
fn part_sum(s: SplitRows, i: u32, o: u32) -> vec4<f32> {
    let c = i % 4u;
    let xl = placed(x32_at(s.xb + 16u * i));
    let xh = placed(x32_at(s.xb + 16u * i + 8u));
    let sums = vec2<f32>(x32_sum(xl), x32_sum(xh));
    return vec4<f32>(chunk_row(s.b0 + o, c, xl, xh, pick(scales(slot(s.b0 + o)), c), sums, qh(s.b0 + o)),
                     chunk_row(s.b1 + o, c, xl, xh, pick(scales(slot(s.b1 + o)), c), sums, qh(s.b1 + o)),
                     chunk_row(s.b2 + o, c, xl, xh, pick(scales(slot(s.b2 + o)), c), sums, qh(s.b2 + o)),
                     chunk_row(s.b3 + o, c, xl, xh, pick(scales(slot(s.b3 + o)), c), sums, qh(s.b3 + o)));
}
