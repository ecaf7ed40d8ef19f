// Quants multiplied where they sit in their word (blocks_k_dot.wgsl, blocks_q6_k_dot.wgsl).
// A quant q < 128 in byte j of a word w is, masked in place, f32(w & (0xff << 8j)) = q * 2^(8j),
// exactly. So X comes to the dots "placed": its value for byte j scaled by 2^(-8j), and each
// product is x * q exactly as if q had been shifted down, one shift fewer per quant. A placed
// vec4's plain sum is dot(v, BYTE_VALUE). Powers of two scale without rounding, so the sums are the
// same floats as before. Measured on lavapipe (2 cores, Intel Xeon model 207, one run, alternating):
// decode GB/s Q4_K 4.02 -> 4.17 at 14336 x 4096, 3.77 -> 3.90 at 8192 x 2048; Q6_K 3.98 -> 4.04 at
// 8192 x 2048.
const BYTE_PLACE = vec4<f32>(1.0, 0.00390625, 1.52587890625e-05, 5.9604644775390625e-08);  // 2^(-8j)
const BYTE_VALUE = vec4<f32>(1.0, 256.0, 65536.0, 16777216.0);  // 2^(8j)

// the 4 bytes of w, each where it sits (byte j times 2^(8j)); each byte must be < 128
fn in_place(w: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) & vec4<u32>(0xffu, 0xff00u, 0xff0000u, 0xff000000u)));
}

// 32 values of X, placed: value 4i + j scaled by 2^(-8j)
fn placed(x: Vec8) -> Vec8 {
    return Vec8(x.a * BYTE_PLACE, x.b * BYTE_PLACE, x.c * BYTE_PLACE, x.d * BYTE_PLACE,
               x.e * BYTE_PLACE, x.f * BYTE_PLACE, x.g * BYTE_PLACE, x.h * BYTE_PLACE);
}
