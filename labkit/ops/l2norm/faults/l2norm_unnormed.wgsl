// FAULTY: q and k passed on unnormed (a port that drops the L2 norm the delta rule assumes).
fn inv_norm(sumsq: f32, eps: f32) -> f32 {
    return 1.0;
}
