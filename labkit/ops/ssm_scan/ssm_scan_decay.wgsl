// ssm_scan's decay, the correct one: a = exp(dt'·A), below 1 as A < 0 (the file's -exp(A_log)); the chunked
// form reads its log, dt'·A, directly (exp then log would underflow to -inf for a large step).
fn log_decay(sp: f32, a: f32) -> f32 {
    return sp * a;
}
fn decay(sp: f32, a: f32) -> f32 {
    return exp(log_decay(sp, a));
}
