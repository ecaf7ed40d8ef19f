// The prefill tile of the drivers on repacked weights (matmul_tiled.wgsl, blocks_<fmt>_tiled.wgsl):
// each thread owns 8 weight rows and 16 tokens (16 x 8 accumulators); matmul_tiled.wgsl has the
// notes on why this shape. X is the chunk's tokens in a texture (to_texture.wgsl); lane l loads
// tokens l and 8 + l and subgroupBroadcast hands each token's 4 values to every lane.
// A driver decodes, per word of 4 values, the 8 rows into two mat4x4 (column j: row j's 4
// values) and calls tile_step; the tile then stores itself with tile_store. Its quad_step is
// quad_step16.wgsl's, composed before this file (the prefill attention scores share it).
@group(0) @binding(1) var X: texture_2d<f32>;  // texel (w, t): values 4w..4w+3 of token t
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

const ROWS_PER_THREAD: u32 = 8u;
const ROWS_PER_WG: u32 = 128u;  // 16 threads x ROWS_PER_THREAD
const TOKENS_PER_WG: u32 = 16u;

struct Tile { live: bool, t0: u32, r: u32, xa: u32, xb: u32 }

// This thread's tile: token tiles fastest (workgroups that run together read the same rows);
// `live` is false past the end of a 2-D grid (uniform per workgroup).
fn tile_of(lin: u32, li: u32, lane: u32) -> Tile {
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let tiles = (P.T + TOKENS_PER_WG - 1u) / TOKENS_PER_WG;
    let t0 = (lin % tiles) * TOKENS_PER_WG;
    // this lane's two tokens, past the end repeating the last one (their sums are never stored)
    let xa = min(t0 + (lane & 7u), P.T - 1u);
    let xb = min(t0 + 8u + (lane & 7u), P.T - 1u);
    return Tile(lin < row_groups * tiles, t0, (lin / tiles) * ROWS_PER_WG + li * ROWS_PER_THREAD, xa, xb);
}

// Row r + j, clamped to the last row: rows past the end compute copies, never stored.
fn tile_row(t: Tile, j: u32) -> u32 {
    return min(t.r + j, P.rows - 1u);
}

// acc[2t] += token t0+t's values 4w..4w+3 times ma (rows r..r+3); acc[2t+1] the same with mb.
// One quad of rows at a time, over all 16 tokens (each token's X broadcast twice): its 16 weights
// stay in registers, where the 32 of both quads, live across the 16 tokens, were reloaded from the
// stack. On lavapipe (Intel Xeon model 207, one run, alternating): T = 64, 4096 x 2048, Q4_K
// 22.5 -> 21.9 ms, Q6_K 25.5 -> 25.0 ms.
fn tile_step(acc: ptr<function, array<vec4<f32>, 32>>, t: Tile, w: u32, ma: mat4x4<f32>, mb: mat4x4<f32>) {
    let va = textureLoad(X, vec2<u32>(w, t.xa), 0);
    let vb = textureLoad(X, vec2<u32>(w, t.xb), 0);
    quad_step(acc, 0u, va, vb, ma);  // h a constant (Mesa inlines the call): acc's indices fold
    quad_step(acc, 1u, va, vb, mb);
}

// Y row for one token: the 8 rows r.. that exist
fn store8(yb: u32, r: u32, lo: vec4<f32>, hi: vec4<f32>) {
    let n = P.rows - min(r, P.rows);
    if (n > 0u) { Y[yb] = lo.x; }
    if (n > 1u) { Y[yb + 1u] = lo.y; }
    if (n > 2u) { Y[yb + 2u] = lo.z; }
    if (n > 3u) { Y[yb + 3u] = lo.w; }
    if (n > 4u) { Y[yb + 4u] = hi.x; }
    if (n > 5u) { Y[yb + 5u] = hi.y; }
    if (n > 6u) { Y[yb + 6u] = hi.z; }
    if (n > 7u) { Y[yb + 7u] = hi.w; }
}

// constant indices only: a dynamic acc[t] would keep the accumulators in memory
fn tile_store(acc: ptr<function, array<vec4<f32>, 32>>, t: Tile) {
    let nt = min(TOKENS_PER_WG, P.T - t.t0);
    let ys = P.y_stride;
    let yb = P.y_offset + t.t0 * ys + P.row0 + t.r;
    let r = t.r;
    store8(yb, r, (*acc)[0], (*acc)[1]);
    if (nt > 1u) { store8(yb + ys, r, (*acc)[2], (*acc)[3]); }
    if (nt > 2u) { store8(yb + 2u * ys, r, (*acc)[4], (*acc)[5]); }
    if (nt > 3u) { store8(yb + 3u * ys, r, (*acc)[6], (*acc)[7]); }
    if (nt > 4u) { store8(yb + 4u * ys, r, (*acc)[8], (*acc)[9]); }
    if (nt > 5u) { store8(yb + 5u * ys, r, (*acc)[10], (*acc)[11]); }
    if (nt > 6u) { store8(yb + 6u * ys, r, (*acc)[12], (*acc)[13]); }
    if (nt > 7u) { store8(yb + 7u * ys, r, (*acc)[14], (*acc)[15]); }
    if (nt > 8u) { store8(yb + 8u * ys, r, (*acc)[16], (*acc)[17]); }
    if (nt > 9u) { store8(yb + 9u * ys, r, (*acc)[18], (*acc)[19]); }
    if (nt > 10u) { store8(yb + 10u * ys, r, (*acc)[20], (*acc)[21]); }
    if (nt > 11u) { store8(yb + 11u * ys, r, (*acc)[22], (*acc)[23]); }
    if (nt > 12u) { store8(yb + 12u * ys, r, (*acc)[24], (*acc)[25]); }
    if (nt > 13u) { store8(yb + 13u * ys, r, (*acc)[26], (*acc)[27]); }
    if (nt > 14u) { store8(yb + 14u * ys, r, (*acc)[28], (*acc)[29]); }
    if (nt > 15u) { store8(yb + 15u * ys, r, (*acc)[30], (*acc)[31]); }
}
