// FAULTY: beta applied twice (the values were already scaled by beta, and the kernel scales again).
fn strength(b: f32) -> f32 {
    return b * b;
}
