// Matmul driver for decode (T = 1) on Q6_K weights in the blocks layout (blocks_repack.wgsl):
// the GGUF blocks themselves, 210 bytes padded to 224 = 14 texels, read with textureLoad.
// 7 bits a weight, where the int8 layout takes 12. Params as
// matmul_matvec.wgsl's; X (a texture), the geometry and X's sharing are quad_rows.wgsl's.
//
// The block's layout and a quarter's arithmetic are blocks_q6_k_dot.wgsl's.
// Each lane loads 4 of every 32 values of X and subgroupBroadcast shares them (as
// matmul_matvec.wgsl); each row's half is read once,
// 6 quant texels for 128 values, and serves its 4 quarters; its scales and d once per block.
// A block's 2 halves are written out, not a loop over n: llvmpipe keeps a loop's carried values
// under an execution mask, and a constant n folds the texel offsets and half_scales' selects.
// Measured on lavapipe (2 cores, Intel Xeon model 207, one run, alternating): 4.40 -> 5.55 GB/s
// at 2048 x 8192, 4.09 -> 4.98 at 8192 x 2048.
// A thread owns two quads (8 rows), so X's loads and broadcasts serve 8 rows, not 4: 4.7 -> 5.2 GB/s at
// 1024 x 4096 (same machine; VM noise up to 20% between runs).

// One row's sum over half n of the block at texel b: its 6 quant texels, for the 4 quarters, with
// the half's scales (half_scales); x[g]: quarter g's X, shared through the subgroup.
fn half_row(b: u32, n: u32, x: array<Vec8, 4>, sc: array<vec4<f32>, 2>) -> f32 {
    let a0 = slot(b + 4u * n);
    let a1 = slot(b + 4u * n + 1u);
    let c0 = slot(b + 4u * n + 2u);
    let c1 = slot(b + 4u * n + 3u);
    let h0 = slot(b + 8u + 2u * n);
    let h1 = slot(b + 9u + 2u * n);
    let lo = sc[0];
    let hi = sc[1];
    let four = vec4<u32>(4u);
    return quarter(x[0], a0, a1, h0, h1, 0u, lo.xy) + quarter(x[1], c0, c1, h0, h1, 1u, lo.zw)
         + quarter(x[2], a0 >> four, a1 >> four, h0, h1, 2u, hi.xy) + quarter(x[3], c0 >> four, c1 >> four, h0, h1, 3u, hi.zw);
}

const ROWS_PER_THREAD: u32 = 8u;  // two quads: X's loads and broadcasts serve 8 rows
const ROWS_PER_WG: u32 = 128u;  // 16 threads x ROWS_PER_THREAD: as many workgroups as with one quad
// a thread, so a 640-row weight keeps 5 (with 32 threads, 3: 640 x 2048 0.22 -> 0.31 ms)

// One quad's 4 sums over half n of the block at texel offset o, with each row's scales (s[j] for
// row j), given the half's X (its 4 quarters', shared through the subgroup).
fn half_quad(q: QuadRows, o: u32, n: u32, x: array<Vec8, 4>, s: array<Scales6, 4>) -> vec4<f32> {
    return vec4<f32>(half_row(q.b0 + o, n, x, half_scales(s[0], n)), half_row(q.b1 + o, n, x, half_scales(s[1], n)),
                     half_row(q.b2 + o, n, x, half_scales(s[2], n)), half_row(q.b3 + o, n, x, half_scales(s[3], n)));
}

// A half's X, placed and shared once for the 8 rows: its 4 quarters, quarter g from vec4s xi + 8 g ..
fn half_x(q: QuadRows, xi: u32) -> array<Vec8, 4> {
    return array<Vec8, 4>(broadcast8(x_lane(q, xi) * BYTE_PLACE), broadcast8(x_lane(q, xi + 8u) * BYTE_PLACE),
                          broadcast8(x_lane(q, xi + 16u) * BYTE_PLACE), broadcast8(x_lane(q, xi + 24u) * BYTE_PLACE));
}

// A quad's 4 rows' scales for the block at texel offset o, read once per block.
fn quad_scales(q: QuadRows, o: u32) -> array<Scales6, 4> {
    return array<Scales6, 4>(scales6(q.b0 + o), scales6(q.b1 + o), scales6(q.b2 + o), scales6(q.b3 + o));
}

@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let row_texels = P.K / 256u * BLOCK_TEXELS;
    let first = quad_rows(wid.x + wid.y * nwg.x, li, lane, row_texels, BLOCK_TEXELS);
    if (!first.live) {
        return;  // uniform per workgroup
    }
    let second = next_quad(first, row_texels, BLOCK_TEXELS);
    var acc: array<vec4<f32>, 2>;
    for (var k = 0u; k < P.K / 256u; k++) {
        let o = k * QUAD * BLOCK_TEXELS;
        let s = array<array<Scales6, 4>, 2>(quad_scales(first, o), quad_scales(second, o));
        let xi = 64u * k;
        // the 2 halves written out, not looped (see the header)
        let xa = half_x(first, xi);
        acc[0] += half_quad(first, o, 0u, xa, s[0]);
        acc[1] += half_quad(second, o, 0u, xa, s[1]);
        let xb = half_x(first, xi + 32u);
        acc[0] += half_quad(first, o, 1u, xb, s[0]);
        acc[1] += half_quad(second, o, 1u, xb, s[1]);
    }
    let y = first.t * P.y_stride + P.row0;
    store4(y + first.r, first.r, acc[0]);
    store4(y + second.r, second.r, acc[1]);
}
