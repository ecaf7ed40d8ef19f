// The selected experts' matmul (ggml's mul_mat_id): for each token t and each of its k slots,
//   Y[y_offset + (t*k + s)*rows + r] = sum_c W_e[r, c] * X[x_offset + t*x_tok + s*x_slot + c],
// e = IDS[ids_offset + t*k + s], the expert the router picked for that slot. W is one window of
// a 3-D expert tensor: experts [e0, e0 + n_e), each `rows` rows of the GGUF bytes, unchanged. A
// slot whose expert lies in another window is that window's dispatch's. Only the selected
// experts' rows are read. Composed after common.wgsl, the format's reader and matmul_row_io.wgsl.
// Each thread owns 4 rows of one slot: the row driver's decode loop, one workgroup per
// (256 rows, slot).
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;
struct Params { K: u32, rows: u32, T: u32, k: u32, e0: u32, n_e: u32, x_offset: u32, x_tok: u32, x_slot: u32, ids_offset: u32, y_offset: u32, n_expert: u32, mode: u32 }
@group(0) @binding(4) var<uniform> P: Params;

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 256u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let slot = lin / row_groups;  // t * k + s
    if (slot >= P.T * P.k) { return; }
    let e = IDS[P.ids_offset + slot];
    if (e < P.e0 || e >= P.e0 + P.n_e) { return; }  // uniform per workgroup
    let t = slot / P.k;
    let s = slot % P.k;
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    // rows past the end compute a copy of the last row and are not stored
    let first = (e - P.e0) * P.rows;
    let rows4 = min(vec4<u32>(r) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u));
    let rb = (vec4<u32>(first) + rows4) * row_bytes(P.K);
    let xb = P.x_offset + t * P.x_tok + s * P.x_slot;
    let nfull = P.K / QK;
    var a = vec4<f32>();
    for (var b = 0u; b < nfull; b++) {
        let ob = b * BLOCK_BYTES;
        let kb = xb + b * QK;
        for (var j = 0u; j < QK / 4u; j++) {
            a += x4(kb + 4u * j, 4u) * w4x4(rb, ob, j, 4u);
        }
    }
    let rem = P.K % QK;
    if (rem > 0u) {  // F32/F16 only: the last, partial 4-value block
        a += x4(xb + nfull * QK, rem) * w4x4(rb, nfull * BLOCK_BYTES, 0u, rem);
    }
    store4(P.y_offset + slot * P.rows + r, r, a);
}
