// FAULTY position for rope.wgsl: a pass of several tokens numbers them from 0 whatever was cached
// before it, so every micro-batch after the first is rotated as if it began the sequence (transformers
// #43082: chunked prefill set position_ids to the chunk's own; nntrainer #3808: layers took offset 0
// for a prefill continued from `from`). A one-shot prompt (pos0 = 0) and a decode step (one token)
// are untouched: only a chunked or continued prompt shows it.
fn position(t: u32) -> u32 {
    return select(P.pos0 + t, t, P.T > 1u);
}
