// ssm_scan's decay, the correct one: a = exp(dt'·A), below 1 as A < 0 (the file's -exp(A_log)).
fn decay(sp: f32, a: f32) -> f32 {
    return exp(sp * a);
}
