// What the decode drivers on the blocks layout share (blocks_<fmt>_matvec.wgsl): X as vec4 in a
// storage buffer (read once per subgroup), the geometry of matmul_matvec.wgsl (each thread owns
// one or two quads of rows of one token: the driver declares ROWS_PER_THREAD, 4 or 8, and
// ROWS_PER_WG, its workgroup's threads' rows), 32 values of X shared through the subgroup (lanes8.wgsl's broadcast8), and where a thread's
// rows start in the weight's texture (blocks_quads.wgsl).
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;

const TOKENS_PER_WG: u32 = 1u;

// A thread's work: its token t, its first row r, the first texel of each of its 4 rows (rows
// past the end read the last row, never stored: no divergent exit), and its lane's first vec4
// of X. `live` is false past the last token (uniform per workgroup).
struct QuadRows { live: bool, t: u32, r: u32, b0: u32, b1: u32, b2: u32, b3: u32, xl: u32 }

fn quad_rows(lin: u32, li: u32, lane: u32, row_texels: u32, unit: u32) -> QuadRows {
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t = lin / row_groups;
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    return quad_at(QuadRows(t < P.T, t, r, 0u, 0u, 0u, 0u, (P.x_offset + t * P.x_stride) / 4u + (lane & 7u)), r, row_texels, unit);
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
