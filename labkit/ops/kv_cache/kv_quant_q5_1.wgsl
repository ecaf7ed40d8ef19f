// Q5_1 cache rows (ggml quantize_row_q5_1_ref): d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5);
// low nibbles in qs, the fifth bits in qh. One 24-byte block a thread.
const BLOCKS: u32 = 1u;

fn quantize_block(x: u32, at: u32) {
    let range = min_max(x);
    let lo = range.x;
    let d = (range.y - lo) / 31.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    var qh = 0u;
    for (var j = 0u; j < 16u; j++) {
        let a = u32((X[x + j] - lo) * id + 0.5);
        let b = u32((X[x + 16u + j] - lo) * id + 0.5);
        put_byte(at + 8u + j, (a & 15u) | ((b & 15u) << 4u));
        qh |= (((a >> 4u) & 1u) << j) | (((b >> 4u) & 1u) << (j + 16u));
    }
    put_u16(at, half_bits(d));
    put_u16(at + 2u, half_bits(lo));
    put_u16(at + 4u, qh);
    put_u16(at + 6u, qh >> 16u);
}
