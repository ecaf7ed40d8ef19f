// BF16 weights: 4 values per "block" (see quant_f32.wgsl for the block interface). A bfloat16 is
// the top half of a float32, so a value is its 16 bits shifted up.
const QK: u32 = 4u;
const BLOCK_BYTES: u32 = 8u;

fn row_bytes(K: u32) -> u32 {
    return K * 2u;
}

const GROUP: u32 = 4u;  // not integer quants: no repacked layout

fn parts4(bb: u32, j: u32) -> Parts4 {
    let a = read_u32(bb);
    let b = read_u32(bb + 4u);
    let bits = vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u);
    return Parts4(bitcast<vec4<f32>>(bits), 1.0, 0.0);
}
