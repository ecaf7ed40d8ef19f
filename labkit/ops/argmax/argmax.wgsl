// The id of each row's largest value: the greedy pick, on the device, so a decode step reads back 4 bytes
// and not a row of logits. Ties go to the lowest id, as numpy's argmax. One workgroup a row: each of its 64
// threads scans every 64th value, then the (value, id) pairs meet in workgroup memory.
// Interface: @binding(0) X: array<f32> [n_rows, n], @binding(1) Y: array<u32> [n_rows], @binding(2) P: Params.
struct Params { n_rows: u32, n: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
@group(0) @binding(2) var<uniform> P: Params;

var<workgroup> best: array<f32, 64>;
var<workgroup> at: array<u32, 64>;

// whether (v, i) beats (w, j): larger, or as large and earlier
fn beats(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;  // uniform per workgroup
    if (row >= P.n_rows) { return; }
    let base = row * P.n;
    var v = bitcast<f32>(0xff800000u);  // -inf
    var i = 0xffffffffu;
    for (var k = li; k < P.n; k += 64u) {
        let x = X[base + k];
        if (beats(x, k, v, i)) { v = x; i = k; }
    }
    best[li] = v;
    at[li] = i;
    for (var half = 32u; half > 0u; half >>= 1u) {
        workgroupBarrier();
        if (li < half && beats(best[li + half], at[li + half], best[li], at[li])) {
            best[li] = best[li + half];
            at[li] = at[li + half];
        }
    }
    if (li == 0u) { Y[row] = min(at[0], P.n - 1u); }  // a row of NaN or -inf only: its last id
}
