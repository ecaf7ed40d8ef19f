// Quantized matmul driver for a prefill on real GPUs: a workgroup of 256 threads computes a tile of
// 64 weight rows x 64 tokens, a thread 4 rows x 4 tokens. K goes by chunks of 32 values: the
// workgroup dequantizes the tile's 64 rows of the chunk (the format's dequant4, from its GGUF
// bytes) and loads the 64 tokens' X into workgroup memory, then each thread takes 64 products per
// 8 vec4 it reads back. wg_reduce (one workgroup per row and 8 tokens) dequantizes each row once
// per 8 tokens; here once per 64. Values past K (F32/F16/BF16 rows of odd width) are zeros.
// Same interface as matmul.wgsl (bindings, Params, ROWS_PER_WG / TOKENS_PER_WG, linear id).
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

const ROWS_PER_WG: u32 = 64u;
const TOKENS_PER_WG: u32 = 64u;
const CHUNK4: u32 = 8u;  // vec4 of K a chunk: 32 values
// [vec4 of the chunk][row or token]: a thread's rows are li % 16 + 16i, so the 16 threads that read
// together read 16 neighbouring vec4 (no bank conflicts); 16 KB in all, WebGPU's default limit
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

// lanes of values k.. past K read as 0
fn live4(k: u32) -> vec4<bool> {
    return vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(P.K);
}

// Chunk kc's vec4 q of weight row r (clamped to the window's last row: its copies are never stored)
fn w_load(r: u32, kc: u32, q: u32) -> vec4<f32> {
    let k = kc + 4u * q;
    let bb = min(r, P.rows - 1u) * row_bytes(P.K) + (k / QK) * BLOCK_BYTES;
    return select(vec4<f32>(0.0), dequant4(bb, (k % QK) / 4u), live4(k));
}

// Chunk kc's vec4 q of token t's X (clamped to the last token)
fn x_load(t: u32, kc: u32, q: u32) -> vec4<f32> {
    let k = kc + 4u * q;
    let i = P.x_offset + min(t, P.T - 1u) * P.x_stride + k;
    return select(vec4<f32>(0.0), vec4<f32>(X[i], X[i + 1u], X[i + 2u], X[i + 3u]), live4(k));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let tok_tiles = (P.T + TOKENS_PER_WG - 1u) / TOKENS_PER_WG;
    if (lin >= tok_tiles * ((P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG)) {
        return;  // whole workgroup: lin is uniform
    }
    let t0 = (lin % tok_tiles) * TOKENS_PER_WG;  // token tiles fastest: neighbours share weight rows
    let r0 = (lin / tok_tiles) * ROWS_PER_WG;
    let tr = li % 16u;  // this thread's rows tr + 16i and tokens tt + 16j within the tile
    let tt = li / 16u;
    var acc: array<vec4<f32>, 4>;  // acc[i][j]: row tr + 16i, token tt + 16j
    for (var kc = 0u; kc < P.K; kc += 4u * CHUNK4) {
        for (var n = li; n < ROWS_PER_WG * CHUNK4; n += 256u) {
            let row = n / CHUNK4;  // neighbouring threads read neighbouring parts of a row
            let q = n % CHUNK4;
            ws[q * ROWS_PER_WG + row] = w_load(r0 + row, kc, q);
            xs[q * TOKENS_PER_WG + row] = x_load(t0 + row, kc, q);
        }
        workgroupBarrier();
        for (var q = 0u; q < CHUNK4; q++) {
            let xq = q * TOKENS_PER_WG + tt;
            let x0 = xs[xq]; let x1 = xs[xq + 16u]; let x2 = xs[xq + 32u]; let x3 = xs[xq + 48u];
            for (var i = 0u; i < 4u; i++) {
                let w = ws[q * ROWS_PER_WG + tr + 16u * i];
                acc[i] += vec4<f32>(dot(w, x0), dot(w, x1), dot(w, x2), dot(w, x3));
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = r0 + tr + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let t = t0 + tt + 16u * j;
            if (r < P.rows && t < P.T) {
                Y[P.y_offset + t * P.y_stride + P.row0 + r] = acc[i][j];
            }
        }
    }
}
