// FAULTY: alpha + dt_bias used as it comes, without its softplus.
fn step(x: f32) -> f32 {
    return x;
}
