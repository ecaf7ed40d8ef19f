// IQ4_NL: 32 values in 18 bytes: d (f16), qs[16]: 4-bit indices into the non-linear table
// KVALUES_IQ4NL (-127 .. 113, generated from gguf.quants). value[i] = d * kvalues[qs[i] & 15],
// value[i + 16] = d * kvalues[qs[i] >> 4], i < 16. (ggml dequantize_row_iq4_nl.)
// Composed after quant_tables (the table). Block interface: see quant_f32.wgsl.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 32u;

fn parts4(bb: u32, j: u32) -> Parts4 {
    let nib = (read_u32(bb + 2u + 4u * (j & 3u)) >> (4u * (j >> 2u))) & 0x0f0f0f0fu;
    return Parts4(lookup_kvalues_iq4nl(nib), read_f16(bb), 0.0);
}
