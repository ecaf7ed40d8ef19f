// Repack a window of GGUF bytes into the layout the fast matmul drivers read
// (matmul_tiled.wgsl, matmul_matvec.wgsl): rows in quads, each quad's int8 quants and
// per-group scales interleaved so that one vec4<u32> load gives the same word of 4 rows.
// It writes a buffer, which labkit/gpu/repack.py copies into the texture the drivers read.
//
// Composed like a matmul kernel: common.wgsl + quant_<fmt>[_variant].wgsl + this file, so the
// quants come from the same parts4 the raw-bytes drivers read, and a faulty format variant
// (Q4_K mins added) is repacked with its fault. Integer formats only (q fits in int8).
//
// Repacked window R, as vec4<u32> slots, for `rows` rows (padded to R4 = rows rounded up to 4,
// pad rows all zero) of K values, quad = r / 4, lane = r % 4, words = K / 4:
//   slot quad * words + w, lane               values 4w..4w+3 of row r as int8 (byte i = 4w+i)
//   slot R4 / 4 * words + 2 * (quad * K/GROUP + g), lane       scale of group g (f32 bits)
//   the slot after it, lane                                     offset of group g
//   value[r, k] = scale * q + offset
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read_write> R: array<u32>;
struct Params { K: u32, rows: u32, row0: u32 }
@group(0) @binding(2) var<uniform> P: Params;

fn pack_i8(q: vec4<f32>) -> u32 {
    let b = bitcast<vec4<u32>>(vec4<i32>(q)) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// One invocation per (row, word) of rows [row0, row0 + rows) of the raw window W.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let words = P.K / 4u;
    let i = (wid.x + wid.y * nwg.x) * 64u + li;
    if (i >= P.rows * words) {
        return;
    }
    let r = i / words;
    let w = i % words;
    let k = 4u * w;
    let quad = r / 4u;
    let lane = r % 4u;
    let p = parts4((P.row0 + r) * row_bytes(P.K) + (k / QK) * BLOCK_BYTES, (k % QK) / 4u);
    R[4u * (quad * words + w) + lane] = pack_i8(p.q);
    if (k % GROUP == 0u) {
        let slot = (P.rows + 3u) / 4u * words + 2u * (quad * (P.K / GROUP) + k / GROUP);
        R[4u * slot + lane] = bitcast<u32>(p.scale);
        R[4u * (slot + 1u) + lane] = bitcast<u32>(p.offset);
    }
}
