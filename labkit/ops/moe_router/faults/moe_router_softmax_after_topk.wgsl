// FAULT (moe_router=softmax_after_topk): under softmax gating, the softmax over the k selected
// logits only, which is each selected probability over their sum: exp(l_i) / Σ_sel exp(l_j) =
// p_i / Σ_sel p_j. (Under softmax_weight gating that is the model's own order.)
fn gate_weight(t: u32, v: f32) -> f32 {
    if (P.gating != 1u) { return v / selected_sum(t); }
    let m = selected_max(t);
    return exp(v - m) / selected_exp_sum(t, m);
}
