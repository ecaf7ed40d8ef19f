// rmsnorm's scale and weight, the correct ones: 1 / sqrt(mean(x^2) + eps), and the weight as stored.
fn inv_rms(mean_sq: f32, eps: f32) -> f32 {
    return 1.0 / sqrt(mean_sq + eps);
}

fn weight(w: f32) -> f32 {
    return w;
}
