// A mixture of experts' router, one thread per token (labkit/ops/moe_router.py), by P.what:
//   0  probs:   Y[t, n_expert] = softmax(X[t])                 X: the router's logits
//   1  ids:     Y[t, k] = the k most probable experts, most probable first, a tie to the lower
//               index, as u32 bits (integer ids)                X: the probabilities
//   2  weights: Y[t, k] = X[t, IDS[t, j]], renormalized to sum to 1 where P.norm
//                                                               X: the probabilities, IDS: the ids
// Composed after its parts, each a function a faulty variant replaces:
//   moe_router_select.wgsl     expert_id(e): the id stored for selected expert e
//   moe_router_weigh.wgsl      gate_weight(p, sel_sum): a selected expert's weight
//   moe_router_normalize.wgsl  normalized(w, total): the weight after renormalization
struct Params { T: u32, n_expert: u32, k: u32, what: u32, norm: u32, x_offset: u32, ids_offset: u32, _p0: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> IDS: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

fn x_at(t: u32, e: u32) -> f32 {
    return X[P.x_offset + t * P.n_expert + e];
}

// whether (p, e) ranks before (bp, be): more probable first, then the lower index
fn ranks_before(p: f32, e: u32, bp: f32, be: u32) -> bool {
    return p > bp || (p == bp && e < be);
}

fn softmax_row(t: u32) {
    var m = x_at(t, 0u);
    for (var e = 1u; e < P.n_expert; e++) { m = max(m, x_at(t, e)); }
    var s = 0.0;
    for (var e = 0u; e < P.n_expert; e++) { s += exp(x_at(t, e) - m); }
    for (var e = 0u; e < P.n_expert; e++) { Y[t * P.n_expert + e] = exp(x_at(t, e) - m) / s; }
}

// the k best by repeated scans: each pick is the best that ranks after the previous pick
fn select_top_k(t: u32) {
    var prev_p = 2.0;  // above any probability
    var prev_e = 0u;
    for (var j = 0u; j < P.k; j++) {
        var bp = -1.0;
        var be = P.n_expert;
        for (var e = 0u; e < P.n_expert; e++) {
            let p = x_at(t, e);
            if (ranks_before(prev_p, prev_e, p, e) && ranks_before(p, e, bp, be)) { bp = p; be = e; }
        }
        Y[t * P.k + j] = bitcast<f32>(expert_id(be));
        prev_p = bp;
        prev_e = be;
    }
}

fn weigh_selected(t: u32) {
    var sel = 0.0;  // the k probabilities' sum
    for (var j = 0u; j < P.k; j++) { sel += x_at(t, IDS[P.ids_offset + t * P.k + j]); }
    var total = 0.0;
    for (var j = 0u; j < P.k; j++) { total += gate_weight(x_at(t, IDS[P.ids_offset + t * P.k + j]), sel); }
    for (var j = 0u; j < P.k; j++) {
        Y[t * P.k + j] = normalized(gate_weight(x_at(t, IDS[P.ids_offset + t * P.k + j]), sel), total);
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 64u;
    if (t >= P.T) { return; }
    if (P.what == 0u) { softmax_row(t); } else if (P.what == 1u) { select_top_k(t); } else { weigh_selected(t); }
}
