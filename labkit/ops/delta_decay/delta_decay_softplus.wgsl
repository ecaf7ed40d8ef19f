// delta_decay's step, the correct one: softplus, as ggml computes it (above 20 as it is).
fn step(x: f32) -> f32 {
    if (x > 20.0) { return x; }
    return log(1.0 + exp(x));
}
