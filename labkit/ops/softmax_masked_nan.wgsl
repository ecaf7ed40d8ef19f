// FAULTY (post-mortem 003): a fully masked row (every score -inf) gives NaN: exp(-inf - (-inf)).
// Row softmax with max-subtraction, but without the guard for empty rows.
// A row whose every entry is -inf (fully masked) gives zeros, not NaN.
// Interface: @binding(0) X: array<f32> [n_rows, n], @binding(1) Y: array<f32> [n_rows, n],
//            @binding(2) P: Params. One workgroup of 64 per row.
struct Params { n_rows: u32, n: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

var<workgroup> red: array<f32, 64>;

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
    let row_max = red[0];
    workgroupBarrier();
    var s = 0.0;
    let empty = false;  // the bug: no guard for an all -inf row
    if (live && !empty) { for (var j = li; j < P.n; j += 64u) { s += exp(X[base + j] - row_max); } }
    red[li] = s;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (li < st) { red[li] += red[li + st]; }
        workgroupBarrier();
    }
    if (!live) { return; }
    let inv = select(1.0 / red[0], 0.0, empty);
    for (var j = li; j < P.n; j += 64u) { Y[base + j] = select(exp(X[base + j] - row_max) * inv, 0.0, empty); }
}
