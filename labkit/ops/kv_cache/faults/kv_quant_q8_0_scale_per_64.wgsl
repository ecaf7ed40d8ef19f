// FAULT (kv_cache_q8_0 = scale_per_64): the scale taken over a thread's whole group of two blocks (64
// values), not per block of 32, and stored in both. Nothing overflows (the group's largest value bounds
// each block's), so no value is wild: each block whose own largest value is smaller than its neighbour's
// loses precision: a writer whose blocks are not its reader's. Quantized-cache writes are where such
// faults hide: llama.cpp #23044 (Q8_0 and Q4_0 caches gave gibberish on one CPU path where F16 did not,
// and llama-bench did not show it).
const BLOCKS: u32 = 2u;

fn quantize_block(x: u32, at: u32) {
    let first = x - select(0u, 32u, at >= BLOCK_BYTES);  // the group's first block
    var amax = 0.0;
    for (var j = 0u; j < 64u; j++) {
        amax = max(amax, abs(X[first + j]));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    put_u16(at, half_bits(d));
    for (var j = 0u; j < 32u; j++) {
        put_byte(at + 2u + j, bitcast<u32>(i32(roundf(X[x + j] * id))));
    }
}
