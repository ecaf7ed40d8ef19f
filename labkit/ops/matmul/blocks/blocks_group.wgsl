// What the drivers on grouped blocks share (blocks_group_matvec.wgsl, blocks_group_tiled.wgsl): the
// legacy formats' 32-value blocks (Q4_0 18 bytes, Q4_1 20, Q5_0 22, Q8_0 34) straddle 16-byte texels,
// so each run of 8 blocks of a row (a group, 256 values) is laid out by field, the same bytes in
// another order: the 8 blocks' quants first (QS_TEXELS texels a block), then AUX_TEXELS texels of
// their other fields (8 f16 scales; Q4_1's 8 mins; Q5_0's 8 words of 5th bits). A group takes whole
// texels with no padding; a row's last group is filled up with zero blocks. The format's file
// (blocks_q4_0.wgsl, ...) says where each field lives and decodes a word of 4 values.
const BLOCK_VALUES: u32 = 32u;
const GROUP_BLOCKS: u32 = 8u;
const GROUP_TEXELS: u32 = GROUP_BLOCKS * QS_TEXELS + AUX_TEXELS;

// One block of one row: its quant texels, its scale and offset (value = scale * q + offset, with
// q as `word` returns it), and its 5th bits (Q5_0).
struct Block { q0: vec4<u32>, q1: vec4<u32>, scale: f32, offset: f32, h: u32 }

alias Aux = array<vec4<u32>, 3>;

// A group's other fields, read once for its 8 blocks (g: the group's first texel).
fn aux_of(g: u32) -> Aux {
    var a: Aux;
    a[0] = slot(g + GROUP_BLOCKS * QS_TEXELS);
    if (AUX_TEXELS > 1u) {
        a[1] = slot(g + GROUP_BLOCKS * QS_TEXELS + 1u);
    }
    if (AUX_TEXELS > 2u) {
        a[2] = slot(g + GROUP_BLOCKS * QS_TEXELS + 2u);
    }
    return a;
}

// the f16 of block i among 8 packed in a texel
fn half_of(t: vec4<u32>, i: u32) -> f32 {
    return unpack2x16float(t[i / 2u])[i % 2u];
}

// Texels a row takes: whole groups, the last one filled up.
fn row_texels(K: u32) -> u32 {
    return (K / BLOCK_VALUES + GROUP_BLOCKS - 1u) / GROUP_BLOCKS * GROUP_TEXELS;
}
