// F32 weights. Block interface (every quant_<fmt>.wgsl defines the same five names):
//   const QK: u32            values per block
//   const BLOCK_BYTES: u32   bytes per block (blocks are packed back to back in a row)
//   const GROUP: u32         values that share one (scale, offset) in parts4
//   fn row_bytes(K: u32) -> u32                 bytes of one row of K values
//   fn parts4(bb: u32, j: u32) -> Parts4        values 4j..4j+3 of the block that starts at
//                                               byte bb of W, for j < QK / 4, as
//                                               scale * q + offset (common.wgsl's dequant4)
// Integer formats give q as the integer quants (int8 range), so a kernel can repack them
// (repack.wgsl); F32 and F16 give the values themselves with scale 1, offset 0.
// For F32 and F16 a "block" is 4 values and K need not be a multiple of 4: the driver reads
// the last, partial block with dequant4 and ignores the lanes past K.
const QK: u32 = 4u;
const BLOCK_BYTES: u32 = 16u;

fn row_bytes(K: u32) -> u32 {
    return K * 4u;
}

const GROUP: u32 = 4u;  // not integer quants: no repacked layout

fn parts4(bb: u32, j: u32) -> Parts4 {
    let w = bb >> 2u;  // rows of f32 are word-aligned
    return Parts4(bitcast<vec4<f32>>(vec4<u32>(W[w], W[w + 1u], W[w + 2u], W[w + 3u])), 1.0, 0.0);
}
