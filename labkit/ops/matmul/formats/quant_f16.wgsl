// F16 weights: 4 halves per "block" (see quant_f32.wgsl for the block interface).
// Rows of an odd number of halves start 2-byte aligned; read_u32 straddles words.
const QK: u32 = 4u;
const BLOCK_BYTES: u32 = 8u;

fn row_bytes(K: u32) -> u32 {
    return K * 2u;
}

const GROUP: u32 = 4u;  // not integer quants: no repacked layout

fn parts4(bb: u32, j: u32) -> Parts4 {
    return Parts4(vec4<f32>(unpack2x16float(read_u32(bb)), unpack2x16float(read_u32(bb + 4u))), 1.0, 0.0);
}
