// A mixture of experts' router, one thread per token (labkit/ops/moe_router.py), by P.what:
//   0  probs:   Y[t, n_expert] = softmax(X[t])                 X: the router's logits
//   1  ids:     Y[t, k] = the k highest-scoring experts, highest first, a tie to the lower
//               index, as u32 bits (integer ids)                X: the probabilities (the logits)
//               The score is X plus B, the selection-only bias, where P.has_bias (exp_probs_b).
//   2  weights: Y[t, k] = X[t, IDS[t, j]], renormalized to sum to 1 where P.norm
//                                                               X: the probabilities, IDS: the ids
// P.gating 0 is softmax gating (the scores are probabilities); 1 is softmax_weight gating (gpt-oss:
// the scores are the logits, and the weights are a softmax over the k selected logits); 2 is sigmoid
// gating (DeepSeek-V3: each probability the sigmoid of its logit, what 0 does after that).
// DeepSeek-V3's group-limited routing, where P.groups > 1: the experts are P.groups equal groups, a
// group's score is its best two selection scores' sum, and the top k come from the P.groups_used best
// groups only. The weights are multiplied by P.w_scale (DeepSeek's routed scaling factor, else 1).
// Composed after its parts, each a function a faulty variant replaces:
//   moe_router_select.wgsl     expert_id(e): the id stored for selected expert e
//   moe_router_score.wgsl      weight_score(t, j): the score selected expert j's weight starts from
//   moe_router_weigh.wgsl      gate_weight(t, v): a selected expert's weight from its score v
//   moe_router_normalize.wgsl  normalized(w, total): the weight after renormalization
//   moe_router_groups.wgsl     allowed_groups(t): the expert groups the top k may come from, as bits
//   moe_router_scale.wgsl      routed_scale(): what the weights are multiplied by at the end
struct Params { T: u32, n_expert: u32, k: u32, what: u32, norm: u32, x_offset: u32, ids_offset: u32, gating: u32,
                has_bias: u32, groups: u32, groups_used: u32, w_scale: f32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> IDS: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> B: array<f32>;  // the selection bias (X's buffer, unread, where none)
@group(0) @binding(4) var<uniform> P: Params;

fn x_at(t: u32, e: u32) -> f32 {
    return X[P.x_offset + t * P.n_expert + e];
}

// expert e's selection-only bias (0 where the model has none)
fn selection_bias(e: u32) -> f32 {
    if (P.has_bias == 0u) { return 0.0; }
    return B[e];
}

// whether (p, e) ranks before (bp, be): more probable first, then the lower index
fn ranks_before(p: f32, e: u32, bp: f32, be: u32) -> bool {
    return p > bp || (p == bp && e < be);
}

fn softmax_row(t: u32) {
    if (P.gating == 2u) {
        for (var e = 0u; e < P.n_expert; e++) { Y[t * P.n_expert + e] = 1.0 / (1.0 + exp(-x_at(t, e))); }
        return;
    }
    let m = row_max(t);
    let s = row_exp_sum(t, m);
    for (var e = 0u; e < P.n_expert; e++) { Y[t * P.n_expert + e] = exp(x_at(t, e) - m) / s; }
}

fn selection_score(t: u32, e: u32) -> f32 {
    return x_at(t, e) + selection_bias(e);
}

fn expert_allowed(e: u32, mask: u32) -> bool {
    if (P.groups <= 1u) { return true; }
    return (mask & (1u << (e / (P.n_expert / P.groups)))) != 0u;
}

// the k best by repeated scans: each pick is the best that ranks after the previous pick
fn select_top_k(t: u32) {
    let neg_inf = bitcast<f32>(0xff800000u);
    let mask = allowed_groups(t);
    var prev_p = 0.0;
    var prev_e = 0u;
    for (var j = 0u; j < P.k; j++) {
        var bp = neg_inf;
        var be = P.n_expert;
        for (var e = 0u; e < P.n_expert; e++) {
            let p = selection_score(t, e);
            let after_prev = j == 0u || ranks_before(prev_p, prev_e, p, e);
            let ok = after_prev && expert_allowed(e, mask);
            if (ok && (be == P.n_expert || ranks_before(p, e, bp, be))) { bp = p; be = e; }
        }
        Y[t * P.k + j] = bitcast<f32>(expert_id(be));
        prev_p = bp;
        prev_e = be;
    }
}

fn selected_id(t: u32, j: u32) -> u32 {
    return IDS[P.ids_offset + t * P.k + j];
}

// selected expert j's score (probability, or logit under softmax_weight gating), without the bias
fn selected(t: u32, j: u32) -> f32 {
    return x_at(t, selected_id(t, j));
}

fn selected_sum(t: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < P.k; j++) { s += selected(t, j); }
    return s;
}

fn selected_max(t: u32) -> f32 {
    var m = selected(t, 0u);
    for (var j = 1u; j < P.k; j++) { m = max(m, selected(t, j)); }
    return m;
}

fn selected_exp_sum(t: u32, m: f32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < P.k; j++) { s += exp(selected(t, j) - m); }
    return s;
}

fn row_max(t: u32) -> f32 {
    var m = x_at(t, 0u);
    for (var e = 1u; e < P.n_expert; e++) { m = max(m, x_at(t, e)); }
    return m;
}

fn row_exp_sum(t: u32, m: f32) -> f32 {
    var s = 0.0;
    for (var e = 0u; e < P.n_expert; e++) { s += exp(x_at(t, e) - m); }
    return s;
}

fn weigh_selected(t: u32) {
    var total = 0.0;
    for (var j = 0u; j < P.k; j++) { total += gate_weight(t, weight_score(t, j)); }
    for (var j = 0u; j < P.k; j++) {
        Y[t * P.k + j] = normalized(gate_weight(t, weight_score(t, j)), total) * routed_scale();
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 64u;
    if (t >= P.T) { return; }
    if (P.what == 0u) { softmax_row(t); } else if (P.what == 1u) { select_top_k(t); } else { weigh_selected(t); }
}
