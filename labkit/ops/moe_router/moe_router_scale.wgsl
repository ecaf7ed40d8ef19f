// moe_router's scale step: the routed scaling factor the weights are multiplied by (DeepSeek's
// routed_scaling_factor, 1 where the model has none).
fn routed_scale() -> f32 {
    return P.w_scale;
}
