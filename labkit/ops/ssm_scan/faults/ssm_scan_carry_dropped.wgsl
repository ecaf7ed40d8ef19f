// FAULTY: past the first chunk, a chunk starts from a zero state (a chunk boundary in the chunked scan that
// drops the carried state). A prompt within one chunk, and every decode step, is right; a longer prompt is not.
fn carried(s: f32, chunk: u32) -> f32 {
    if (chunk > 0u) { return 0.0; }
    return s;
}
