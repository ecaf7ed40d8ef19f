// A quantized KV cache's store and load (labkit/ops/kv_cache). Composed after common.wgsl, the type's
// reader (matmul/formats/quant_<type>.wgsl: QK, BLOCK_BYTES, parts4) and its writer (kv_quant_<type>.wgsl:
// BLOCKS, the blocks one thread writes, a whole number of words, and quantize_block).
// mode 0, store: rows [0, rows) of X (from x_offset) quantized into the cache's rows row0.., then read back
//   into Y (from y_offset) as the attention will read them.
// mode 1, load: the cache's rows [0, rows) into Y (from y_offset) as f32: what the attention reads.
// A cache row is row_words words (its blocks, padded to a word). Any workgroup count covers every row.
struct Params { mode: u32, row0: u32, rows: u32, width: u32, row_words: u32, x_offset: u32, y_offset: u32, _p0: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const GROUP_WORDS: u32 = BLOCKS * BLOCK_BYTES / 4u;
var<private> OUT: array<u32, GROUP_WORDS>;  // the group's bytes as quantize_block puts them

fn put_byte(at: u32, v: u32) {
    OUT[at >> 2u] |= (v & 0xffu) << ((at & 3u) * 8u);
}

fn put_u16(at: u32, v: u32) {
    put_byte(at, v);
    put_byte(at + 1u, v >> 8u);
}

fn half_bits(x: f32) -> u32 {
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}

// C's roundf: halves away from zero (WGSL's round() takes them to even).
fn roundf(x: f32) -> f32 {
    let a = abs(x);
    let f = floor(a);
    return sign(x) * (f + floor(2.0 * (a - f)));
}

// The value of largest magnitude in a block of 32 (the first of equals), with its sign.
fn signed_max(x: u32) -> f32 {
    var amax = 0.0;
    var m = 0.0;
    for (var j = 0u; j < 32u; j++) {
        let v = X[x + j];
        if (amax < abs(v)) {
            amax = abs(v);
            m = v;
        }
    }
    return m;
}

// The smallest and the largest value of a block of 32 (the offset formats' min and max).
fn min_max(x: u32) -> vec2<f32> {
    var lo = 3.4028235e38;
    var hi = -3.4028235e38;
    for (var j = 0u; j < 32u; j++) {
        lo = min(lo, X[x + j]);
        hi = max(hi, X[x + j]);
    }
    return vec2<f32>(lo, hi);
}

fn store_group(r: u32, b0: u32, nb: u32, base: u32) {
    for (var i = 0u; i < GROUP_WORDS; i++) {
        OUT[i] = 0u;
    }
    for (var b = 0u; b < nb; b++) {
        quantize_block(P.x_offset + r * P.width + (b0 + b) * QK, b * BLOCK_BYTES);
    }
    let words = (nb * BLOCK_BYTES + 3u) / 4u;
    for (var i = 0u; i < words; i++) {
        W[(base >> 2u) + i] = OUT[i];
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let blocks_per_row = P.width / QK;
    let groups_per_row = (blocks_per_row + BLOCKS - 1u) / BLOCKS;
    let n = P.rows * groups_per_row;
    let stride = nwg.x * nwg.y * 64u;
    for (var k = gid.x + gid.y * nwg.x * 64u; k < n; k += stride) {
        let r = k / groups_per_row;
        let b0 = (k % groups_per_row) * BLOCKS;
        let nb = min(BLOCKS, blocks_per_row - b0);
        let row = select(r, P.row0 + r, P.mode == 0u);
        let base = row * P.row_words * 4u + b0 * BLOCK_BYTES;  // the group's first byte in the cache
        if (P.mode == 0u) {
            store_group(r, b0, nb, base);
        }
        for (var b = 0u; b < nb; b++) {
            let y = P.y_offset + r * P.width + (b0 + b) * QK;
            for (var j = 0u; j < QK / 4u; j++) {
                let v = dequant4(base + b * BLOCK_BYTES, j);
                Y[y + 4u * j] = v.x;
                Y[y + 4u * j + 1u] = v.y;
                Y[y + 4u * j + 2u] = v.z;
                Y[y + 4u * j + 3u] = v.w;
            }
        }
    }
}
