// rope.wgsl's position of token t of the pass: after the pos0 positions cached before it.
fn position(t: u32) -> u32 {
    return P.pos0 + t;
}
