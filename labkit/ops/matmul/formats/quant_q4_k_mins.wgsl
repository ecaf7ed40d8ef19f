// Q4_K's min term (composed after quant_q4_k.wgsl): dmin * m is SUBTRACTED, as ggml's
// "d * sc * q - dmin * m" does; parts4's offset is added to every value, so it is -m.
fn q4_k_min(m: f32) -> f32 {
    return -m;
}
