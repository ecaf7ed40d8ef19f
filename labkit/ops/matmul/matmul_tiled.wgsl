// Matmul driver for prefill (T > 1) on repacked weights (repack.wgsl): each thread owns 8
// weight rows (two quads) and a tile of 16 tokens (16 x 8 accumulators: tile16.wgsl, composed
// before this file), so every weight word it loads serves 16 tokens. Same Params and geometry
// constants as matmul.wgsl, but both operands are textures: W holds one window in the repacked
// layout (repacked.wgsl), and X is the chunk's tokens as to_texture.wgsl copies them (so
// x_offset and x_stride are not read here). Composed after a line declaring the format's GROUP.
//
// X is shared through the subgroup: lane l loads tokens l and 8 + l of the tile, and
// subgroupBroadcast hands each token's 4 values to every lane. Needs subgroups of at least 8
// lanes (lavapipe's are 8, NVIDIA's 32: lanes past 8 load copies nobody reads).
//
// 16 threads a workgroup (128 rows): with 64 (512 rows) Gemma's 256- and 640-row weights left a
// third to a half of each workgroup computing copies of the last quad; a 128-token pass capturing
// output_norm went from 0.90 to 0.80 s on Gemma and from 1.08-1.35 to 0.92 s on SmolLM2.
//
// Why this shape (FACTS.md, measured on lavapipe): llvmpipe runs each storage load as a
// per-lane loop, so the count of loads sets the speed (textures are gathered, 7x faster here,
// hence both operands in textures): one vec4<u32> texel brings the same word of 4 rows, one
// vec4<f32> texel 4 values of X; broadcasting X through the subgroup is
// 2-2.5x over register blocking alone; accumulators indexed only by constants; no shared
// memory (llvmpipe's barriers and shared loads are its slowest path).
@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_of(wid.x + wid.y * nwg.x, li, lane);
    if (!t.live) {
        return;
    }
    // quads past the end compute copies of the last quad, never stored (no divergent exit)
    let quads = (P.rows + 3u) / 4u;
    let qa = min(t.r / 4u, quads - 1u);
    let qb = min(t.r / 4u + 1u, quads - 1u);
    let words = P.K / 4u;
    let gpr = P.K / GROUP;
    let sbase = quads * words;
    var acc: array<vec4<f32>, 32>;  // acc[2t]: rows r..r+3 of token t0+t; acc[2t+1]: rows r+4..r+7
    for (var g = 0u; g < gpr; g++) {
        let sa = bitcast<vec4<f32>>(slot(sbase + 2u * (qa * gpr + g)));
        let oa = bitcast<vec4<f32>>(slot(sbase + 2u * (qa * gpr + g) + 1u));
        let sb = bitcast<vec4<f32>>(slot(sbase + 2u * (qb * gpr + g)));
        let ob = bitcast<vec4<f32>>(slot(sbase + 2u * (qb * gpr + g) + 1u));
        for (var j = 0u; j < GROUP / 4u; j++) {
            let w = g * (GROUP / 4u) + j;
            tile_step(&acc, t, w, quad4(slot(qa * words + w), sa, oa), quad4(slot(qb * words + w), sb, ob));
        }
    }
    tile_store(&acc, t);
}
