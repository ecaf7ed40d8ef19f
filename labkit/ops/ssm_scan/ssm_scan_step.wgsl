// ssm_scan's step, the correct one: dt' = softplus(dt), as ggml computes it (dt above 20 as it is).
fn step(dt: f32) -> f32 {
    if (dt > 20.0) { return dt; }
    return log(1.0 + exp(dt));
}
