// Quantized matmul driver: one weight row per thread, a tile of up to 8 tokens per thread.
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
//     into 2-D above 65 535 per dimension: linear id = wid.x + wid.y * nwg.x, row groups
//     fastest (id = tile * row_groups + row_group); ids past the end return at once.
//   K must be a multiple of QK, except for F32/F16 (QK = 4) where the last partial block
//   is read whole and its lanes past K are ignored.
//
// This layout has no barriers and no shared memory: on lavapipe (CPU) it is the fastest
// (0.35 s vs 1.9 s for element-per-thread + shared-memory reduction on 262144 x 640 Q8_0).
// Each dequantized vec4 is reused for every token of the tile (prefill).
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

const ROWS_PER_WG: u32 = 64u;
const TOKENS_PER_WG: u32 = 8u;

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(X[i], X[i + 1u], X[i + 2u], X[i + 3u]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let tile = lin / row_groups;
    let r = (lin % row_groups) * ROWS_PER_WG + li;
    let t0 = tile * TOKENS_PER_WG;
    if (r >= P.rows || t0 >= P.T) {
        return;
    }
    let nt = min(TOKENS_PER_WG, P.T - t0);
    let xs = P.x_stride;
    let xb = P.x_offset + t0 * xs;
    let rb = r * row_bytes(P.K);
    let nfull = P.K / QK;
    let rem = P.K % QK;
    var acc: array<f32, TOKENS_PER_WG>;
    if (nt == 1u) {
        // decode: one token, no tile loop
        var a = 0.0;
        for (var b = 0u; b < nfull; b++) {
            let bb = rb + b * BLOCK_BYTES;
            let kb = xb + b * QK;
            for (var j = 0u; j < QK / 4u; j++) {
                a += dot(dequant4(bb, j), x4(kb + 4u * j));
            }
        }
        acc[0] = a;
    } else {
        for (var b = 0u; b < nfull; b++) {
            let bb = rb + b * BLOCK_BYTES;
            let kb = xb + b * QK;
            for (var j = 0u; j < QK / 4u; j++) {
                let w = dequant4(bb, j);
                let k = kb + 4u * j;
                for (var t = 0u; t < nt; t++) {
                    acc[t] += dot(w, x4(k + t * xs));
                }
            }
        }
    }
    if (rem > 0u) {
        let w = dequant4(rb + nfull * BLOCK_BYTES, 0u);
        let k = xb + nfull * QK;
        for (var t = 0u; t < nt; t++) {
            for (var i = 0u; i < rem; i++) {
                acc[t] += w[i] * X[k + t * xs + i];
            }
        }
    }
    let yb = P.y_offset + t0 * P.y_stride + P.row0 + r;
    for (var t = 0u; t < nt; t++) {
        Y[yb + t * P.y_stride] = acc[t];
    }
}
