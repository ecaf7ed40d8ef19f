// Q8_0: 32 values in 34 bytes: d (f16), qs[32] (int8). value[i] = d * qs[i].
// (ggml dequantize_row_q8_0.) Block interface: see quant_f32.wgsl.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    return Parts4(ibytes4(read_u32(bb + 2u + 4u * j)), read_f16(bb), 0.0);
}
