// Quantized matmul driver: one workgroup per (weight row, tile of up to 8 tokens); the 64
// threads stride over the row's vec4 pieces and combine through a shared-memory tree.
// Better on real GPUs (coalesced weight reads); slower on lavapipe than matmul.wgsl.
// Same interface as matmul.wgsl (bindings, Params, ROWS_PER_WG / TOKENS_PER_WG, linear id);
// see the top of matmul.wgsl.
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

const ROWS_PER_WG: u32 = 1u;
const TOKENS_PER_WG: u32 = 8u;
const WG: u32 = 64u;

var<workgroup> part: array<f32, 512>;  // [TOKENS_PER_WG][WG]

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(X[i], X[i + 1u], X[i + 2u], X[i + 3u]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let r = lin % P.rows;
    let t0 = (lin / P.rows) * TOKENS_PER_WG;
    if (t0 >= P.T) {
        return;  // whole workgroup: lin is uniform
    }
    let nt = min(TOKENS_PER_WG, P.T - t0);
    let xs = P.x_stride;
    let xb = P.x_offset + t0 * xs;
    let rb = r * row_bytes(P.K);
    let nfull = P.K / QK;
    let rem = P.K % QK;
    let per_block = QK / 4u;
    var acc: array<f32, TOKENS_PER_WG>;
    for (var p = li; p < nfull * per_block; p += WG) {
        let b = p / per_block;
        let j = p % per_block;
        let w = dequant4(rb + b * BLOCK_BYTES, j);
        let k = xb + b * QK + 4u * j;
        for (var t = 0u; t < nt; t++) {
            acc[t] += dot(w, x4(k + t * xs));
        }
    }
    if (rem > 0u && li == 0u) {
        let w = dequant4(rb + nfull * BLOCK_BYTES, 0u);
        let k = xb + nfull * QK;
        for (var t = 0u; t < nt; t++) {
            for (var i = 0u; i < rem; i++) {
                acc[t] += w[i] * X[k + t * xs + i];
            }
        }
    }
    for (var t = 0u; t < nt; t++) {
        part[t * WG + li] = acc[t];
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            for (var t = 0u; t < nt; t++) {
                part[t * WG + li] += part[t * WG + li + stride];
            }
        }
        workgroupBarrier();
    }
    if (li < nt) {
        Y[P.y_offset + (t0 + li) * P.y_stride + P.row0 + r] = part[li * WG];
    }
}
