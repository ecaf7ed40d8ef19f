// The selected experts' matmul at prefill, tokens gathered per expert: each expert's rows are
// decoded once per tile of up to TILE slots that picked it, not once per slot (ggml's mul_mat_id
// groups the rows of `ids` by expert the same way). Same sums as moe_matmul.wgsl:
//   Y[y_offset + slot*rows + r] = sum_c W_e[r, c] * X[x_offset + t*x_tok + s*x_slot + c],
// slot = t*k + s, e = IDS[ids_offset + slot]. Two dispatches, by P.mode:
//   0  gather: one thread per expert e lists its slots in order: LIST[e*(T+1)] = how many,
//      LIST[e*(T+1) + 1 + i] = the i-th slot (a token picks an expert at most once: <= T slots)
//   1  multiply: one workgroup per (expert of this window, tile of its slots, 256 rows); each
//      thread owns 4 rows for every slot of the tile
// Composed after common.wgsl, the format's reader and matmul_row_io.wgsl.
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;
@group(0) @binding(4) var<storage, read_write> LIST: array<u32>;
struct Params { K: u32, rows: u32, T: u32, k: u32, e0: u32, n_e: u32, x_offset: u32, x_tok: u32, x_slot: u32, ids_offset: u32, y_offset: u32, n_expert: u32, mode: u32 }
@group(0) @binding(5) var<uniform> P: Params;

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 256u;
const GATHER_TILE: u32 = 8u;  // slots per workgroup

fn gather(e: u32) {
    if (e >= P.n_expert) { return; }
    let base = e * (P.T + 1u);
    var n = 0u;
    for (var slot = 0u; slot < P.T * P.k; slot++) {
        if (IDS[P.ids_offset + slot] == e) {
            LIST[base + 1u + n] = slot;
            n++;
        }
    }
    LIST[base] = n;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;
    if (P.mode == 0u) { gather(lin * 64u + li); return; }
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let tiles = (P.T + GATHER_TILE - 1u) / GATHER_TILE;
    let el = lin / (row_groups * tiles);
    if (el >= P.n_e) { return; }
    let e = P.e0 + el;
    let base = e * (P.T + 1u);
    let s0 = ((lin / row_groups) % tiles) * GATHER_TILE;
    let count = LIST[base];
    if (s0 >= count) { return; }  // uniform per workgroup
    let n_s = min(GATHER_TILE, count - s0);
    var xb: array<u32, 8>;
    for (var i = 0u; i < n_s; i++) {
        let slot = LIST[base + 1u + s0 + i];
        xb[i] = P.x_offset + (slot / P.k) * P.x_tok + (slot % P.k) * P.x_slot;
    }
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    // rows past the end compute a copy of the last row and are not stored
    let rows4 = min(vec4<u32>(r) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u));
    let rb = (vec4<u32>(el * P.rows) + rows4) * row_bytes(P.K);
    let nfull = P.K / QK;
    var acc: array<vec4<f32>, 8>;
    for (var b = 0u; b < nfull; b++) {
        let ob = b * BLOCK_BYTES;
        for (var j = 0u; j < QK / 4u; j++) {
            let w = w4x4(rb, ob, j, 4u);
            for (var i = 0u; i < n_s; i++) { acc[i] += x4(xb[i] + b * QK + 4u * j, 4u) * w; }
        }
    }
    let rem = P.K % QK;
    if (rem > 0u) {  // F32/F16 only: the last, partial 4-value block
        let w = w4x4(rb, nfull * BLOCK_BYTES, 0u, rem);
        for (var i = 0u; i < n_s; i++) { acc[i] += x4(xb[i] + nfull * QK, rem) * w; }
    }
    for (var i = 0u; i < n_s; i++) {
        store4(P.y_offset + LIST[base + 1u + s0 + i] * P.rows + r, r, acc[i]);
    }
}
