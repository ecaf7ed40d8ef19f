// delta_decay's A, the correct one: the file's ssm_a as it is (-exp(A_log), below 0).
fn signed(a: f32) -> f32 {
    return a;
}
