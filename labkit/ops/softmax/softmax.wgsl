// Row softmax: Y[r, j] = exp(X[r, j] - c) / (Σ exp(X[r, :] - c) + exp(sink - c)), c = shift(max).
// With P.sinks (gpt-oss), row r's head has a learned logit SINKS[r / rows_per_head] that enters the
// max and the denominator but owns no column (llama.cpp's soft_max with sinks); else there is none.
// Composed after a part that gives shift(row_max) and row_is_empty(row_max): softmax_stable.wgsl,
// or a faulty variant's. A row whose every entry is -inf (fully masked, no sink) gives zeros.
// Interface: @binding(0) X: array<f32> [n_rows, n], @binding(1) Y: array<f32> [n_rows, n],
//            @binding(2) SINKS: array<f32> [heads] (any buffer without sinks), @binding(3) P.
//            ROWS_PER_WG rows a workgroup of 64, ROW_THREADS (8) threads a row.
// A row's 8 threads reduce through lanes8.wgsl's max8 and sum8 (subgroup shuffles: any subgroup of 8 or more
// consecutive invocations holds whole rows), not workgroup memory and barriers, which llvmpipe
// runs as coroutines: on lavapipe (Intel Xeon model 207) 32 x 512 x 512 scores took 84 ms with
// one workgroup a row and barriers.
// Each turn of a row loop takes STRIDE = 32 values, 4 a thread: llvmpipe ends a loop after 65535
// turns of all of an invocation's loops together, so 3 loops of n / 8 turns stopped short at a
// 262144-value row (its last loop wrote 8 values).
struct Params { n_rows: u32, n: u32, rows_per_head: u32, sinks: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> SINKS: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const ROW_THREADS: u32 = 8u;
const ROWS_PER_WG: u32 = 8u;  // 64 / ROW_THREADS
const STRIDE: u32 = 32u;  // values a row loop's turn takes: 4 a thread

// the max of m and the thread's 4 values of the turn at j (j + 8i, those in the row)
fn turn_max(base: u32, j: u32, m: f32) -> f32 {
    var r = m;
    if (j < P.n) { r = max(r, X[base + j]); }
    if (j + 8u < P.n) { r = max(r, X[base + j + 8u]); }
    if (j + 16u < P.n) { r = max(r, X[base + j + 16u]); }
    if (j + 24u < P.n) { r = max(r, X[base + j + 24u]); }
    return r;
}

fn turn_sum(base: u32, j: u32, c: f32) -> f32 {
    var s = 0.0;
    if (j < P.n) { s += exp(X[base + j] - c); }
    if (j + 8u < P.n) { s += exp(X[base + j + 8u] - c); }
    if (j + 16u < P.n) { s += exp(X[base + j + 16u] - c); }
    if (j + 24u < P.n) { s += exp(X[base + j + 24u] - c); }
    return s;
}

fn turn_write(base: u32, j: u32, c: f32, inv: f32, empty: bool) {
    if (j < P.n) { Y[base + j] = select(exp(X[base + j] - c) * inv, 0.0, empty); }
    if (j + 8u < P.n) { Y[base + j + 8u] = select(exp(X[base + j + 8u] - c) * inv, 0.0, empty); }
    if (j + 16u < P.n) { Y[base + j + 16u] = select(exp(X[base + j + 16u] - c) * inv, 0.0, empty); }
    if (j + 24u < P.n) { Y[base + j + 24u] = select(exp(X[base + j + 24u] - c) * inv, 0.0, empty); }
}

fn sink_of(r: u32) -> f32 {
    if (P.sinks == 0u) { return bitcast<f32>(0xff800000u); }
    return SINKS[r / P.rows_per_head];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = (wid.x + wid.y * nwg.x) * ROWS_PER_WG + li / ROW_THREADS;
    let lane = li % ROW_THREADS;
    let live = r < P.n_rows;  // the same for a row's 8 threads
    let base = r * P.n;
    var m = bitcast<f32>(0xff800000u);
    if (live) { for (var j = lane; j < P.n; j += STRIDE) { m = turn_max(base, j, m); } }
    var sink = bitcast<f32>(0xff800000u);
    if (live) { sink = sink_of(r); }
    let row_max = max(max8(m), sink);
    let c = shift(row_max);
    let empty = row_is_empty(row_max);
    var s = 0.0;
    if (live && !empty) { for (var j = lane; j < P.n; j += STRIDE) { s += turn_sum(base, j, c); } }
    var total = sum8(s);
    if (!live) { return; }
    if (P.sinks != 0u && !empty) { total += exp(sink - c); }
    let inv = select(1.0 / total, 0.0, empty);
    for (var j = lane; j < P.n; j += STRIDE) { turn_write(base, j, c, inv, empty); }
}
