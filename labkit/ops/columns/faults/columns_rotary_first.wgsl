// FAULT (columns=rotary_first), columns' start part: every group taken from the start of its slot, the offset
// ignored, as an engine that assumes the rotary values come first ([rope | nope], DeepSeek's indexer layout)
// reads MLA's [nope | rope] rows: the rotary key is read out of the latent, each head's rotary query out of
// its unrotated part.
fn group_start(g: u32) -> u32 {
    return g * P.step;  // the bug: P.offset ignored
}
