// Q8_0 in grouped blocks (blocks_group.wgsl): block i's 32 int8 quants in texels 2i and 2i + 1 of
// its group, the 8 blocks' d (f16) in texel 16. value 4w + k is byte k of word w: d * q. 8.5 bits a
// weight, as in the file (the int8 layout: 10).
const QS_TEXELS: u32 = 2u;
const AUX_TEXELS: u32 = 1u;

fn block_at(g: u32, i: u32, aux: Aux) -> Block {
    return Block(slot(g + 2u * i), slot(g + 2u * i + 1u), half_of(aux[0], i), 0.0, 0u);
}

fn word(b: Block, w: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(select(b.q1[w & 3u], b.q0[w & 3u], w < 4u)));
}
