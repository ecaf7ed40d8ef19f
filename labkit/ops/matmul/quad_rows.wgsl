// What the decode drivers on the blocks layout share (blocks_<fmt>_matvec.wgsl): X in a texture
// (to_texture.wgsl fills it before the driver runs), the geometry of matmul_matvec.wgsl (each thread
// owns one or two quads of rows of one token: the driver declares ROWS_PER_THREAD, 4 or 8, and
// ROWS_PER_WG, its workgroup's threads' rows), 32 values of X shared through the subgroup (lanes8.wgsl's
// broadcast8), and where a thread's rows start in the weight's texture (blocks_quads.wgsl).
// X is a texture, as in matmul_matvec.wgsl and the prefill tiles: llvmpipe loads a storage buffer a
// lane at a time, and those loads took a fifth of the driver's time, more than the fill's dispatch
// costs. On lavapipe (AMD EPYC family 25, 2 cores, best of 7, alternating, the fill
// included; same floats): Q4_K 8192 x 2048 4.52 -> 3.85 ms, 4096 x 14336 13.3 -> 10.7 ms,
// 2048 x 2048 1.14 -> 0.99 ms; Q6_K 32768 x 2048 23.1 -> 19.3 ms, 8192 x 2048 6.08 -> 5.17 ms.
@group(0) @binding(1) var X: texture_2d<f32>;  // texel (w, t): values 4w..4w+3 of token t

const TOKENS_PER_WG: u32 = 1u;

// A thread's work: its token t, its first row r, the first texel of each of its 4 rows (rows
// past the end read the last row, never stored: no divergent exit), and its lane's first vec4
// of X (its column in X's texture). `live` is false past the last token (uniform per workgroup).
struct QuadRows { live: bool, t: u32, r: u32, b0: u32, b1: u32, b2: u32, b3: u32, xl: u32 }

fn quad_rows(lin: u32, li: u32, lane: u32, row_texels: u32, unit: u32) -> QuadRows {
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t = lin / row_groups;
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    return quad_at(QuadRows(t < P.T, t, r, 0u, 0u, 0u, 0u, lane & 7u), r, row_texels, unit);
}

// The thread's second quad (rows r + 4 .. r + 7), for a driver with 8 rows a thread.
fn next_quad(q: QuadRows, row_texels: u32, unit: u32) -> QuadRows {
    return quad_at(q, q.r + QUAD, row_texels, unit);
}

// q's work moved to the quad of rows r .. r + 3: their first texels, rows past the end clamped to the last
fn quad_at(q: QuadRows, r: u32, row_texels: u32, unit: u32) -> QuadRows {
    let last = P.rows - 1u;
    return QuadRows(q.live, q.t, r, row_start(min(r, last), row_texels, unit), row_start(min(r + 1u, last), row_texels, unit),
                    row_start(min(r + 2u, last), row_texels, unit), row_start(min(r + 3u, last), row_texels, unit), q.xl);
}

// This lane's vec4 of X at column xl + w of its token's row: lane l of a group of 8 loads the
// vec4s l, l + 8, ... of a run, and broadcast8 hands all 8 to every lane.
fn x_lane(q: QuadRows, w: u32) -> vec4<f32> {
    return textureLoad(X, vec2<u32>(q.xl + w, q.t), 0);
}
