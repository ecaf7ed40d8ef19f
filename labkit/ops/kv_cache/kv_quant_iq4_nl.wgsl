// IQ4_NL cache rows (ggml quantize_row_iq4_nl_ref, as llama.cpp's CPU cache write runs it: no scale search):
// the nearest table entries at the scale m / -127 (m the value of largest magnitude), then the
// least-squares scale over them with weights x², summed in order. Two 18-byte blocks a thread.
const BLOCKS: u32 = 2u;
var<private> KVALUES: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                               1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

// ggml's best_index_int8: the nearest entry, the lower one on a tie.
fn best_index(a: f32) -> u32 {
    if (a <= KVALUES[0]) { return 0u; }
    if (a >= KVALUES[15]) { return 15u; }
    var ml = 0u;
    var mu = 15u;
    while (mu - ml > 1u) {
        let mav = (ml + mu) / 2u;
        if (a < KVALUES[mav]) { mu = mav; } else { ml = mav; }
    }
    return select(mu, mu - 1u, a - KVALUES[mu - 1u] < KVALUES[mu] - a);
}

fn quantize_block(x: u32, at: u32) {
    let m = signed_max(x);
    let amax = abs(m);
    var L: array<u32, 32>;
    var d = 0.0;
    if (amax >= 1e-15) {
        let id = 1.0 / (m / KVALUES[0]);
        var sumqx = 0.0;
        var sumq2 = 0.0;
        for (var j = 0u; j < 32u; j++) {
            let v = X[x + j];
            L[j] = best_index(id * v);
            let q = KVALUES[L[j]];
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        d = select(0.0, sumqx / sumq2, sumq2 > 0.0);
    }
    put_u16(at, half_bits(d));
    for (var j = 0u; j < 16u; j++) {
        put_byte(at + 2u + j, L[j] | (L[j + 16u] << 4u));
    }
}
