// Q4_0 cache rows (ggml quantize_row_q4_0_ref): d = m / -8 for the value m of largest magnitude (the first),
// q = min(15, trunc(x / d + 8.5)); value j and j + 16 share a byte. Two 18-byte blocks a thread.
const BLOCKS: u32 = 2u;

fn quantize_block(x: u32, at: u32) {
    let d = signed_max(x) / -8.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    put_u16(at, half_bits(d));
    for (var j = 0u; j < 16u; j++) {
        let a = min(15, i32(X[x + j] * id + 8.5));
        let b = min(15, i32(X[x + 16u + j] * id + 8.5));
        put_byte(at + 2u + j, u32(a) | (u32(b) << 4u));
    }
}
