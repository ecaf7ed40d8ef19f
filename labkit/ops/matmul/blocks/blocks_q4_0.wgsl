// Q4_0 in grouped blocks (blocks_group.wgsl): block i's 16 bytes of nibbles in texel i of its group,
// the 8 blocks' d (f16) in texel 8. value 4w + k of a block (w < 8, k < 4) is nibble k of word w % 4,
// the low nibbles for w < 4: d * (q - 8). 4.5 bits a weight, as in the file (the int8 layout: 10).
const QS_TEXELS: u32 = 1u;
const AUX_TEXELS: u32 = 1u;

fn block_at(g: u32, i: u32, aux: Aux) -> Block {
    let d = half_of(aux[0], i);
    return Block(slot(g + i), vec4<u32>(), d, -8.0 * d, 0u);
}

fn word(b: Block, w: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8((b.q0[w & 3u] >> (4u * (w / 4u))) & 0x0f0f0f0fu));
}
