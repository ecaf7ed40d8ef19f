// moe_router's score step: the score selected expert j's weight starts from: its probability (its
// logit under softmax_weight gating), without the selection bias, which only ranks (llama.cpp's
// build_moe_ffn gathers the weights from `probs`, not from `probs + exp_probs_b`).
fn weight_score(t: u32, j: u32) -> f32 {
    return selected(t, j);
}
