// Q4_K in the blocks layout: the GGUF block (ggml block_q4_K, 144 bytes) as 9 texels of 4 words.
//   texel 0       d, dmin (two f16 in word 0), the 12 bytes of 6-bit scales and mins
//   texels 1..8   qs[128]: 64-value chunk c lives in texels 1 + 2c and 2 + 2c;
//                 value 64c + l is the low nibble of its byte l, value 64c + 32 + l the high
//   value = d * sc[is] * q - dmin * m[is], is = 2c (low) or 2c + 1 (high)
// 4.5 bits a weight, where the int8 layout takes 10. Read by blocks_k_matvec.wgsl and
// blocks_k_tiled.wgsl, which Q5_K shares.
const BLOCK_TEXELS: u32 = 9u;
const QS_TEXEL: u32 = 1u;  // the first texel of qs
const HAS_QH: bool = false;  // no 5th bit
