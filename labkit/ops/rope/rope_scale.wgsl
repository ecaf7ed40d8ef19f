// What rope.wgsl (and its faulty variant) compose after them: a model's RoPE scaling, as ggml's
// rope_yarn computes it. Reads the kernel's P (freq_scale, ext_factor, attn_factor, corr_low,
// corr_high, has_factors) and FACTORS; YaRN's magnitude comes from rope_magnitude.wgsl (a fault's part).

// The file's per-pair factor (llama3's rope_freqs.weight), the angle is divided by; 1 without one.
fn pair_factor(i: u32) -> f32 {
    if (P.has_factors == 0u) { return 1.0; }
    return FACTORS[i];
}

// ggml's rope_yarn: (the angle, the cos/sin magnitude). The angle times freq_scale (1/factor), and
// under YaRN (ext_factor != 0) mixed back to the unscaled angle below the correction dims, with the
// magnitude attn_factor · (1 + 0.1·ln(1/freq_scale)). Unscaled (1, 0, 1): the angle itself, and 1.
fn scaled_angle(theta_extrap: f32, i: u32) -> vec2<f32> {
    var theta = P.freq_scale * theta_extrap;
    var mscale = P.attn_factor;
    if (P.ext_factor != 0.0) {
        let y = (f32(i) - P.corr_low) / max(0.001, P.corr_high - P.corr_low);
        let mix = (1.0 - clamp(y, 0.0, 1.0)) * P.ext_factor;
        theta = theta * (1.0 - mix) + theta_extrap * mix;
        mscale = mscale * yarn_magnitude();
    }
    return vec2<f32>(theta, mscale);
}
