// Q4_1 cache rows (ggml quantize_row_q4_1_ref): d = (max - min) / 15, m = min,
// q = min(15, trunc((x - min) / d + 0.5)). One 20-byte block a thread.
const BLOCKS: u32 = 1u;

fn quantize_block(x: u32, at: u32) {
    let range = min_max(x);
    let lo = range.x;
    let d = (range.y - lo) / 15.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    put_u16(at, half_bits(d));
    put_u16(at + 2u, half_bits(lo));
    for (var j = 0u; j < 16u; j++) {
        let a = min(15, i32((X[x + j] - lo) * id + 0.5));
        let b = min(15, i32((X[x + 16u + j] - lo) * id + 0.5));
        put_byte(at + 4u + j, u32(a) | (u32(b) << 4u));
    }
}
