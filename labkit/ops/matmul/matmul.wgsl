// Quantized matmul driver: each thread owns 4 consecutive weight rows and a tile of up to 8
// tokens (4 x 8 accumulators); no barriers, no shared memory.
//
// A matmul module is three files composed in order (labkit.gpu.matmul.matmul_source):
//   common.wgsl        safe byte / u16 / f16 / straddling-u32 readers over W
//   quant_<fmt>.wgsl   the block format: QK, BLOCK_BYTES, row_bytes(K), dequant4(bb, j)
//                      (dequant4 returns values 4j..4j+3 of the block starting at byte bb)
//   a driver           this file, or matmul_wg_reduce.wgsl, or a variant
//
// Driver interface (every driver variant keeps these bindings, this struct and constants):
//   @binding(0) W: array<u32>        one window: rows [row0, row0 + rows) of the weight, the
//                                    GGUF bytes unchanged; window row r starts at byte
//                                    r * row_bytes(K)
//   @binding(1) X: array<f32>        activations [T, K]: X[x_offset + t * x_stride + k]
//   @binding(2) Y: array<f32>        output [T, N]:      Y[y_offset + t * y_stride + n]
//   @binding(3) P: Params (uniform)  K: columns, rows: rows in this window, T: tokens,
//                                    row0: the window's first row in the whole weight
//   Y[y_offset + t*y_stride + row0 + r] = sum_k W[r, k] * X[x_offset + t*x_stride + k]
//   for r < rows, t < T; nothing else in Y is written. f32 activations and accumulators.
//   const ROWS_PER_WG, TOKENS_PER_WG: the host launches
//     ceil(rows / ROWS_PER_WG) * ceil(T / TOKENS_PER_WG) workgroups as a 1-D count, split
//     into 2-D above 65 535 per dimension: linear id = wid.x + wid.y * nwg.x; ids past the end
//     return at once. Each driver maps the id to (row group, token tile) its own way: here row
//     groups fastest (id = tile * row_groups + row_group), token tiles fastest in matmul_tiled.
//   K must be a multiple of QK, except for F32/F16 (QK = 4) where the last partial block
//   is read whole and its lanes past K are ignored.
//
// Why this shape (measured on lavapipe, 262144 x 640 Q8_0, on a busy 2-core machine):
// - a row per thread with no barriers beats element-per-thread + shared-memory reduction
//   (0.35 s vs 1.9 s, FACTS.md); one workgroup per row (matmul_wg_reduce.wgsl) takes ~2.7 s;
// - X reads cost more than the weight reads (llvmpipe apparently loads them lane by lane
//   inside loops, although every lane reads the same address): sharing each X load between
//   4 rows halved decode (0.75 s -> 0.37 s);
// - the token tile shares each dequantized vec4 between tokens: T = 8 went 4.5 s -> 1.0 s
//   once the accumulators were indexed only by constants (any dynamic acc[t] puts them in
//   memory and costs ~25%).
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 256u;  // 64 threads x ROWS_PER_THREAD
const TOKENS_PER_WG: u32 = 8u;

// acc[t][i] += dot(X[token t0 + t, k .. k + 3], column i of m), for the tile's tokens.
// Tokens past nt repeat the last one (their sums are never stored); 4..7 only when nt > 4.
fn accum(acc: ptr<function, array<vec4<f32>, 8>>, m: mat4x4<f32>, k: u32, n: u32, nt: u32) {
    let xs = P.x_stride;
    (*acc)[0] += x4(k, n) * m;
    (*acc)[1] += x4(k + min(1u, nt - 1u) * xs, n) * m;
    (*acc)[2] += x4(k + min(2u, nt - 1u) * xs, n) * m;
    (*acc)[3] += x4(k + min(3u, nt - 1u) * xs, n) * m;
    if (nt > 4u) {
        (*acc)[4] += x4(k + 4u * xs, n) * m;
        (*acc)[5] += x4(k + min(5u, nt - 1u) * xs, n) * m;
        (*acc)[6] += x4(k + min(6u, nt - 1u) * xs, n) * m;
        (*acc)[7] += x4(k + min(7u, nt - 1u) * xs, n) * m;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t0 = (lin / row_groups) * TOKENS_PER_WG;
    if (t0 >= P.T) {
        return;  // past the end of a 2-D grid (uniform per workgroup)
    }
    let nt = min(TOKENS_PER_WG, P.T - t0);
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    // rows past the end compute a copy of the last row and are not stored (no divergent exit)
    let last = P.rows - 1u;
    let rb = min(vec4<u32>(r) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * row_bytes(P.K);
    let nfull = P.K / QK;
    let rem = P.K % QK;
    let xb = P.x_offset + t0 * P.x_stride;
    var acc: array<vec4<f32>, 8>;
    if (nt == 1u) {
        // decode: one token
        var a = vec4<f32>();
        for (var b = 0u; b < nfull; b++) {
            let ob = b * BLOCK_BYTES;
            let kb = xb + b * QK;
            for (var j = 0u; j < QK / 4u; j++) {
                a += x4(kb + 4u * j, 4u) * w4x4(rb, ob, j, 4u);
            }
        }
        acc[0] = a;
    } else {
        for (var b = 0u; b < nfull; b++) {
            let ob = b * BLOCK_BYTES;
            let kb = xb + b * QK;
            for (var j = 0u; j < QK / 4u; j++) {
                accum(&acc, w4x4(rb, ob, j, 4u), kb + 4u * j, 4u, nt);
            }
        }
    }
    if (rem > 0u) {
        // F32/F16 only: the last, partial 4-value block
        accum(&acc, w4x4(rb, nfull * BLOCK_BYTES, 0u, rem), xb + nfull * QK, rem, nt);
    }
    // constant indices only: a dynamic acc[t] would keep the accumulators in memory
    let yb = P.y_offset + t0 * P.y_stride + P.row0 + r;
    let ys = P.y_stride;
    store4(yb, r, acc[0]);
    if (nt > 1u) { store4(yb + ys, r, acc[1]); }
    if (nt > 2u) { store4(yb + 2u * ys, r, acc[2]); }
    if (nt > 3u) { store4(yb + 3u * ys, r, acc[3]); }
    if (nt > 4u) { store4(yb + 4u * ys, r, acc[4]); }
    if (nt > 5u) { store4(yb + 5u * ys, r, acc[5]); }
    if (nt > 6u) { store4(yb + 6u * ys, r, acc[6]); }
    if (nt > 7u) { store4(yb + 7u * ys, r, acc[7]); }
}
