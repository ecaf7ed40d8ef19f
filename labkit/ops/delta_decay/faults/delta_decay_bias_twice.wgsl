// FAULTY: dt_bias added twice (a fused projection added it already, and the kernel adds it again).
fn biased(alpha: f32, bias: f32) -> f32 {
    return alpha + 2.0 * bias;
}
