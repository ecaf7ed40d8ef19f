// moe_router's weight step: a selected expert's weight, before any renormalization, from its score v.
// Softmax gating: v is its probability under the softmax over ALL experts, as it is. Softmax_weight
// gating (gpt-oss): v is its logit, and the softmax is over the k selected logits.
fn gate_weight(t: u32, v: f32) -> f32 {
    if (P.gating != 1u) { return v; }
    let m = selected_max(t);
    return exp(v - m) / selected_exp_sum(t, m);
}
