// FAULTY (post-mortem 000/003): gemma's (1 + w) offset applied a second time. The converter
// already folded the +1 into the stored weights, so this computes X / rms * (1 + W).
fn inv_rms(mean_sq: f32, eps: f32) -> f32 {
    return 1.0 / sqrt(mean_sq + eps);
}

fn weight(w: f32) -> f32 {
    return 1.0 + w;
}
