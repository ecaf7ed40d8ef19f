// FAULT (moe_router=bias_in_weights): the selection bias added to the weights too: each selected
// expert's weight starts from its probability plus its exp_probs_b (the same experts, other weights).
fn weight_score(t: u32, j: u32) -> f32 {
    return selected(t, j) + selection_bias(selected_id(t, j));
}
