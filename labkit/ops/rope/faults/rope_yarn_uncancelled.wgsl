// FAULT (rope=yarn_uncancelled), rope's YaRN magnitude part: 1 + 0.1·ln(1/freq_scale) applied twice, as if the
// model's attn_factor did not cancel it. DeepSeek puts YaRN's magnitude in the softmax scale (mscale²) and
// cancels it in the rotation; an engine that keeps it in the rotation too scales the rotary part of every score
// by it twice more.
fn yarn_magnitude() -> f32 {
    let m = 1.0 + 0.1 * log(1.0 / P.freq_scale);
    return m * m;  // the bug: the cancelled magnitude applied again
}
