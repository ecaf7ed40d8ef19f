// What rope.wgsl composes for the fault rope=yarn_uncancelled: ggml's rope_yarn with YaRN's magnitude
// (1 + 0.1·ln(1/freq_scale)) applied once more, as if the model's attn_factor did not cancel it. DeepSeek
// puts YaRN's magnitude in the softmax scale (mscale²) and cancels it in the rotation; an engine that
// keeps it in the rotation too scales the rotary part of every score by it twice more.

fn pair_factor(i: u32) -> f32 {
    if (P.has_factors == 0u) { return 1.0; }
    return FACTORS[i];
}

fn scaled_angle(theta_extrap: f32, i: u32) -> vec2<f32> {
    var theta = P.freq_scale * theta_extrap;
    var mscale = P.attn_factor;
    if (P.ext_factor != 0.0) {
        let y = (f32(i) - P.corr_low) / max(0.001, P.corr_high - P.corr_low);
        let mix = (1.0 - clamp(y, 0.0, 1.0)) * P.ext_factor;
        theta = theta * (1.0 - mix) + theta_extrap * mix;
        let yarn = 1.0 + 0.1 * log(1.0 / P.freq_scale);
        mscale = mscale * yarn * yarn;  // the bug: the cancelled magnitude applied again
    }
    return vec2<f32>(theta, mscale);
}
