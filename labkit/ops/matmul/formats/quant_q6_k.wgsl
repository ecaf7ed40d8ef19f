// Q6_K: 256 values in 210 bytes: ql[128], qh[64], scales[16] (int8), d (f16) at byte 208.
// For half n (0..1), quarter g (0..3), l < 32 (v = 128n + 32g + l):
//   low 4 bits  = ql[64n + 32(g & 1) + l], low nibble for g < 2, high nibble for g >= 2
//   high 2 bits = (qh[32n + l] >> 2g) & 3
//   value[v]    = d * scales[8n + 2g + l / 16] * ((low | high << 4) - 32)
// (ggml dequantize_row_q6_K.) Blocks are only 2-byte aligned. Block interface: quant_f32.wgsl.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn row_bytes(K: u32) -> u32 {
    return K / QK * BLOCK_BYTES;
}

const GROUP: u32 = 16u;  // a scale per 16 values

fn parts4(bb: u32, j: u32) -> Parts4 {
    let n = j >> 5u;            // 128-value half
    let g = (j >> 3u) & 3u;     // 32-value quarter of the half
    let l0 = 4u * (j & 7u);     // first l of the 4 values
    let ql = read_u32(bb + 64u * n + 32u * (g & 1u) + l0);
    let qh = read_u32(bb + 128u + 32u * n + l0);
    let q = ((ql >> (4u * (g >> 1u))) & 0x0f0f0f0fu) | (((qh >> (2u * g)) & 0x03030303u) << 4u);
    let sc = f32(read_i8(bb + 192u + 8u * n + 2u * g + (l0 >> 4u)));
    return Parts4(bytes4(q) - 32.0, read_f16(bb + 208u) * sc, 0.0);
}
