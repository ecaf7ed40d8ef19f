// FAULTY: A without its minus sign (exp(A_log) where the file holds -exp(A_log)): a > 1, the state grows.
fn log_decay(sp: f32, a: f32) -> f32 {
    return -sp * a;
}
fn decay(sp: f32, a: f32) -> f32 {
    return exp(log_decay(sp, a));
}
