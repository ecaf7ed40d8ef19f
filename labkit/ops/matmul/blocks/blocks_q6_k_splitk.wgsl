// Matmul driver for decode (T = 1) on Q6_K weights in the blocks layout, for real GPUs: the
// geometry and the entry point are splitk_rows.wgsl's (64 threads share 4 rows), a quarter's arithmetic
// blocks_q6_k_dot.wgsl's. A thread's part is 64 values of block k's half n: quarters p and
// p + 2, which share their low-bit texels (low and high nibbles), for each of the 4 rows.

// One row's sum over quarters p and p + 2 of half n of the block at texel b; xa, xb their X.
fn pair_row(b: u32, n: u32, p: u32, xa: Vec8, xb: Vec8) -> f32 {
    let l0 = slot(b + 4u * n + 2u * p);
    let l1 = slot(b + 4u * n + 2u * p + 1u);
    let h0 = slot(b + 8u + 2u * n);
    let h1 = slot(b + 9u + 2u * n);
    let sc = half_scales(scales6(b), n);
    let lo = sc[0];  // quarters 0, 1
    let hi = sc[1];  // quarters 2, 3
    let s_lo = select(lo.xy, lo.zw, p == 1u);
    let s_hi = select(hi.xy, hi.zw, p == 1u);
    let four = vec4<u32>(4u);
    return quarter(xa, l0, l1, h0, h1, p, s_lo) + quarter(xb, l0 >> four, l1 >> four, h0, h1, p + 2u, s_hi);
}

// The 4 rows' sums over part i (block i / 4, at texel offset o): quarters p and p + 2 of half n.
fn part_sum(s: SplitRows, i: u32, o: u32) -> vec4<f32> {
    let n = (i / 2u) % 2u;
    let p = i % 2u;
    let xq = s.xb + 64u * (i / 4u) + 32u * n + 8u * p;  // quarter p's first vec4; quarter p + 2 is 16 on
    let xa = placed(x32_at(xq));
    let xb = placed(x32_at(xq + 16u));
    return vec4<f32>(pair_row(s.b0 + o, n, p, xa, xb), pair_row(s.b1 + o, n, p, xa, xb),
                     pair_row(s.b2 + o, n, p, xa, xb), pair_row(s.b3 + o, n, p, xa, xb));
}
