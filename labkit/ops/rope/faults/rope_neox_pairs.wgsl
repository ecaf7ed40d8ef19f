// FAULTY (rope=neox_pairs), rope's pairing part: a normal-style model (adjacent pairs: llama, DeepSeek's
// rotary parts) rotated in halves, pairs (i, i + rope_dim/2), whatever P.neox says.
fn neox_pairs() -> bool {
    return true;  // the bug: P.neox ignored
}
