// columns' start part: group g of a row starts at offset + g·step (DeepSeek's rotary part of each head after
// its unrotated part, the rotary key after the latent).
fn group_start(g: u32) -> u32 {
    return P.offset + g * P.step;
}
