// FAULT (moe_router=softmax_before_topk): under softmax_weight gating (gpt-oss), the softmax over ALL
// experts' logits, gathered at the selected ones: the same experts, weights that sum to less than 1.
// (Under softmax gating that is the model's own order.)
fn gate_weight(t: u32, v: f32) -> f32 {
    if (P.gating != 1u) { return v; }
    let m = row_max(t);
    return exp(v - m) / row_exp_sum(t, m);
}
