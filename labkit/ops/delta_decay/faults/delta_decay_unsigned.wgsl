// FAULTY: A without its minus sign (exp(A_log) where the file holds -exp(A_log)): e^g > 1, the state grows.
fn signed(a: f32) -> f32 {
    return -a;
}
