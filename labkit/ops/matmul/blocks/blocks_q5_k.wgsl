// Q5_K in the blocks layout: the GGUF block (ggml block_q5_K, 176 bytes) as 11 texels of 4 words.
//   texel 0        d, dmin (two f16 in word 0), the 12 bytes of 6-bit scales and mins (as Q4_K)
//   texels 1..2    qh[32]: bit is of qh[l] is the 5th bit of value 32 is + l
//   texels 3..10   qs[128]: 64-value chunk c lives in texels 3 + 2c and 4 + 2c (as Q4_K's)
//   value = d * sc[is] * (q + 16 * bit is of qh[l]) - dmin * m[is], is = 2c (low) or 2c + 1 (high)
// 5.5 bits a weight, where the int8 layout takes 10. Read by blocks_k_matvec.wgsl and
// blocks_k_tiled.wgsl, which Q4_K shares.
const BLOCK_TEXELS: u32 = 11u;
const QS_TEXEL: u32 = 3u;  // the first texel of qs
const HAS_QH: bool = true;  // texels 1 and 2 hold the 5th bits
