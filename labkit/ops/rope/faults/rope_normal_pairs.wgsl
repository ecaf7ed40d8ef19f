// FAULTY (rope=normal_pairs), rope's pairing part: a neox-style model run with normal rope, pairs
// (2i, 2i + 1) rotated whatever P.neox says.
fn neox_pairs() -> bool {
    return false;  // the bug: P.neox ignored
}
