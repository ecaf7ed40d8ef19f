// delta_decay's bias, the correct one: dt_bias added once.
fn biased(alpha: f32, bias: f32) -> f32 {
    return alpha + bias;
}
