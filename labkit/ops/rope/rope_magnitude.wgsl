// rope's YaRN magnitude part: ggml's rope_yarn multiplies cos and sin by 1 + 0.1·ln(1/freq_scale) (times the
// model's attn_factor, which DeepSeek sets to cancel it).
fn yarn_magnitude() -> f32 {
    return 1.0 + 0.1 * log(1.0 / P.freq_scale);
}
