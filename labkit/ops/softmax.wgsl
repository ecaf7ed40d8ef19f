// Row softmax: Y[r, j] = exp(X[r, j] - c) / (Σ exp(X[r, :] - c) + exp(sink - c)), c = shift(max).
// With P.sinks (gpt-oss), row r's head has a learned logit SINKS[r / rows_per_head] that enters the
// max and the denominator but owns no column (llama.cpp's soft_max with sinks); else there is none.
// Composed after a part that gives shift(row_max) and row_is_empty(row_max): softmax_stable.wgsl,
// or a faulty variant's. A row whose every entry is -inf (fully masked, no sink) gives zeros.
// Interface: @binding(0) X: array<f32> [n_rows, n], @binding(1) Y: array<f32> [n_rows, n],
//            @binding(2) SINKS: array<f32> [heads] (any buffer without sinks), @binding(3) P.
//            One workgroup of 64 per row.
struct Params { n_rows: u32, n: u32, rows_per_head: u32, sinks: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> SINKS: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> red: array<f32, 64>;

fn sink_of(r: u32) -> f32 {
    if (P.sinks == 0u) { return bitcast<f32>(0xff800000u); }
    return SINKS[r / P.rows_per_head];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * nwg.x;
    let live = r < P.n_rows;
    let base = r * P.n;
    var m = bitcast<f32>(0xff800000u);
    if (live) { for (var j = li; j < P.n; j += 64u) { m = max(m, X[base + j]); } }
    red[li] = m;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (li < st) { red[li] = max(red[li], red[li + st]); }
        workgroupBarrier();
    }
    var sink = bitcast<f32>(0xff800000u);
    if (live) { sink = sink_of(r); }
    let row_max = max(red[0], sink);
    let c = shift(row_max);
    let empty = row_is_empty(row_max);
    workgroupBarrier();
    var s = 0.0;
    if (live && !empty) { for (var j = li; j < P.n; j += 64u) { s += exp(X[base + j] - c); } }
    red[li] = s;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (li < st) { red[li] += red[li + st]; }
        workgroupBarrier();
    }
    if (!live) { return; }
    var total = red[0];
    if (P.sinks != 0u && !empty) { total += exp(sink - c); }
    let inv = select(1.0 / total, 0.0, empty);
    for (var j = li; j < P.n; j += 64u) { Y[base + j] = select(exp(X[base + j] - c) * inv, 0.0, empty); }
}
