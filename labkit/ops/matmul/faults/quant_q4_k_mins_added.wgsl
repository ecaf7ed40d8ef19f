// FAULTY (post-mortems 001/000), in place of quant_q4_k_mins.wgsl: the mins ADDED instead of
// subtracted, so weights that should be negative come out positive.
fn q4_k_min(m: f32) -> f32 {
    return m;
}
