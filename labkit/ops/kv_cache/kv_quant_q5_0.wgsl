// Q5_0 cache rows (ggml quantize_row_q5_0_ref): d = m / -16 for the value m of largest magnitude,
// q = min(31, trunc(x / d + 16.5)); low nibbles in qs, the fifth bits in qh. Two 22-byte blocks a thread.
const BLOCKS: u32 = 2u;

fn quantize_block(x: u32, at: u32) {
    let d = signed_max(x) / -16.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    var qh = 0u;
    for (var j = 0u; j < 16u; j++) {
        let a = u32(min(31, i32(X[x + j] * id + 16.5)));
        let b = u32(min(31, i32(X[x + 16u + j] * id + 16.5)));
        put_byte(at + 6u + j, (a & 15u) | ((b & 15u) << 4u));
        qh |= ((a >> 4u) << j) | ((b >> 4u) << (j + 16u));
    }
    put_u16(at, half_bits(d));
    put_u16(at + 2u, qh);
    put_u16(at + 4u, qh >> 16u);
}
