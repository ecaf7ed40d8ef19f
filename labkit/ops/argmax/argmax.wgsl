// The id of each row's largest value: the greedy pick, on the device, so a decode step reads back 4 bytes
// and not a row of logits. Ties go to the lowest id, as numpy's argmax. Two dispatches: first each of a
// row's P.parts workgroups takes its slice of the row (its 64 threads every 64th value, then the (value, id)
// pairs meet in workgroup memory) and writes its pair to PART; then one workgroup a row meets the pairs.
// A row of 262 144 logits is one workgroup's scan no more: the device's cores share it.
// Interface: @binding(0) X: array<f32> [n_rows, n], @binding(1) PART: array<f32> [n_rows, parts, 2]
//            (a value, an id's bits), @binding(2) Y: array<u32> [n_rows], @binding(3) P: Params.
struct Params { n_rows: u32, n: u32, parts: u32, phase: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> PART: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<u32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> best: array<f32, 64>;
var<workgroup> at: array<u32, 64>;

// whether (v, i) beats (w, j): larger, or as large and earlier
fn beats(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

// the workgroup's best pair, from each thread's own
fn meet(li: u32, v: f32, i: u32) {
    best[li] = v;
    at[li] = i;
    for (var half = 32u; half > 0u; half >>= 1u) {
        workgroupBarrier();
        if (li < half && beats(best[li + half], at[li + half], best[li], at[li])) {
            best[li] = best[li + half];
            at[li] = at[li + half];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lin = wid.x + wid.y * nwg.x;  // uniform per workgroup
    var v = bitcast<f32>(0xff800000u);  // -inf
    var i = 0xffffffffu;
    if (P.phase == 0u) {
        let row = lin / P.parts;
        let part = lin % P.parts;
        if (row >= P.n_rows) { return; }
        let size = (P.n + P.parts - 1u) / P.parts;
        let end = min(P.n, (part + 1u) * size);
        for (var k = part * size + li; k < end; k += 64u) {
            let x = X[row * P.n + k];
            if (beats(x, k, v, i)) { v = x; i = k; }
        }
        meet(li, v, i);
        if (li == 0u) {
            PART[2u * lin] = best[0];
            PART[2u * lin + 1u] = bitcast<f32>(at[0]);
        }
        return;
    }
    let row = lin;
    if (row >= P.n_rows) { return; }
    for (var k = li; k < P.parts; k += 64u) {
        let x = PART[2u * (row * P.parts + k)];
        let j = bitcast<u32>(PART[2u * (row * P.parts + k) + 1u]);
        if (beats(x, j, v, i)) { v = x; i = j; }
    }
    meet(li, v, i);
    if (li == 0u) { Y[row] = min(at[0], P.n - 1u); }  // a row of NaN or -inf only: its last id
}
