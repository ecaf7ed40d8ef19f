// Repack a window of GGUF bytes into the blocks layout: each block in its own run of 16-byte
// texels (BLOCK_TEXELS of them, declared by a line before this file), bytes unchanged, the
// tail of the last texel zero. Q4_K (144 bytes) and Q5_K (176) fill whole texels; a Q6_K
// block (210) gets 14 bytes of padding. Composed after common.wgsl, the format's block reader
// (QK, BLOCK_BYTES, row_bytes) and blocks_quads.wgsl: rows in quads, a quad's 4 rows side by
// side block by block, the last quad filled up with zero rows.
@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read_write> R: array<u32>;
struct Params { K: u32, rows: u32, row0: u32 }
@group(0) @binding(2) var<uniform> P: Params;

// One invocation per word of the repacked window.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let words = 4u * BLOCK_TEXELS;  // per block
    let blocks = P.K / QK;  // per row
    let quads = (P.rows + QUAD - 1u) / QUAD;
    let i = (wid.x + wid.y * nwg.x) * 64u + li;
    if (i >= quads * QUAD * blocks * words) {
        return;
    }
    let unit = i / words;  // the quad's block k of its row j, at unit (q QUAD blocks + k QUAD + j)
    let w = i % words;
    let in_quad = unit % (QUAD * blocks);
    let row = (unit / (QUAD * blocks)) * QUAD + in_quad % QUAD;
    var v = 0u;
    if (row < P.rows && 4u * w < BLOCK_BYTES) {
        v = read_u32((P.row0 + row) * row_bytes(P.K) + (in_quad / QUAD) * BLOCK_BYTES + 4u * w);
        let keep = BLOCK_BYTES - 4u * w;
        if (keep < 4u) {
            v = v & ((1u << (8u * keep)) - 1u);
        }
    }
    R[i] = v;
}
