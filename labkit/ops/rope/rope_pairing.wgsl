// rope's pairing part: neox pairs (i, i + rope_dim/2) where the model says so (P.neox), else
// normal pairs (2i, 2i + 1).
fn neox_pairs() -> bool {
    return P.neox == 1u;
}
