// Q5_0 in grouped blocks (blocks_group.wgsl): block i's 16 bytes of nibbles in texel i of its group,
// the 8 blocks' d (f16) in texel 8, their qh words (bit v: value v's 5th bit) in texels 9 and 10.
// value 4w + k is nibble k of word w % 4 (low nibbles for w < 4) with bit 4w + k of qh on top:
// d * (q - 16). 5.5 bits a weight, as in the file.
const QS_TEXELS: u32 = 1u;
const AUX_TEXELS: u32 = 3u;

fn block_at(g: u32, i: u32, aux: Aux) -> Block {
    let d = half_of(aux[0], i);
    return Block(slot(g + i), vec4<u32>(), d, -16.0 * d, aux[1u + i / 4u][i & 3u]);
}

fn word(b: Block, w: u32) -> vec4<f32> {
    let h = (b.h >> (4u * w)) & 0xfu;  // the 5th bits of values 4w .. 4w + 3
    let hb = ((h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u)) << 4u;
    return vec4<f32>(unpack4xU8(((b.q0[w & 3u] >> (4u * (w / 4u))) & 0x0f0f0f0fu) | hb));
}
