// Q8_0 cache rows (ggml quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d). Two 34-byte blocks a thread.
const BLOCKS: u32 = 2u;

fn q8_0_scale(x: u32) -> f32 {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(X[x + j]));
    }
    return amax / 127.0;
}

fn quantize_block(x: u32, at: u32) {
    let d = q8_0_scale(x);
    let id = select(0.0, 1.0 / d, d != 0.0);
    put_u16(at, half_bits(d));
    for (var j = 0u; j < 32u; j++) {
        put_byte(at + 2u + j, bitcast<u32>(i32(roundf(X[x + j] * id))));
    }
}
