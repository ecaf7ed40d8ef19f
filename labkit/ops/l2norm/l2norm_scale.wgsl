// l2norm's factor, the correct one: 1 / sqrt(Σx² + eps), as ggml's rms_norm(x, eps/n) · 1/sqrt(n).
fn inv_norm(sumsq: f32, eps: f32) -> f32 {
    return 1.0 / sqrt(sumsq + eps);
}
