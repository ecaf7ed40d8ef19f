// FAULTY (post-mortem 003 hypothesis C): rmsnorm's eps added outside the square root:
// Y = X / (sqrt(mean(X^2)) + eps) * W. Nearly harmless for normal inputs, wrong near zero.
fn inv_rms(mean_sq: f32, eps: f32) -> f32 {
    return 1.0 / (sqrt(mean_sq) + eps);
}

fn weight(w: f32) -> f32 {
    return w;
}
