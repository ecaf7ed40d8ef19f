// FAULT (moe_router=softmax_after_topk): the softmax over the k selected logits only, which is
// each selected probability over their sum: exp(l_i) / Σ_sel exp(l_j) = p_i / Σ_sel p_j.
fn gate_weight(p: f32, sel_sum: f32) -> f32 {
    return p / sel_sum;
}
