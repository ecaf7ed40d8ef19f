// Matmul driver for decode (T = 1) on repacked weights (repack.wgsl): each thread owns one
// quad of weight rows of one token; a workgroup covers 128 rows. Same bindings, Params and
// geometry constants as matmul.wgsl, except that W holds one window in the repacked layout
// and X is a texture (texel (w, t): values 4w..4w+3 of token t), which to_texture.wgsl fills
// before the driver runs, as the tiles' X. Composed after a line declaring the format's GROUP.
//
// Per 32 values of K, lane l loads vec4 l of them and subgroupBroadcast shares them,
// so each X value is loaded once per subgroup, not once per lane; one texel of W brings a
// word of all 4 rows, and each group's scales and offsets come once per group.
// X is a texture because llvmpipe loads a storage buffer a lane at a time. On lavapipe (AMD EPYC
// family 25, 2 cores, AVX2, best of 7, alternating, the fill included; the same floats), against X
// in a buffer: Q8_0 8192 x 2048 7.12 -> 5.19 ms, 2048 x 640 0.94 -> 0.49 ms, 640 x 640 0.41 ->
// 0.32 ms; Q5_0 8192 x 2048 7.20 -> 5.15 ms; Q4_1 576 x 576 0.30 -> 0.27 ms. (On an Intel Xeon
// with AVX-512, with an earlier driver, the fill did not pay: a Gemma decode step 91 ms against 101.)
// 32 threads a workgroup (128 rows): against 64, SmolLM2 decode went from 12.5 to 13.0 tok/s
// and Gemma's from 11.5 to 11.8 (fewer rows computed past the end of 192-, 576- and 640-row
// weights; 16 threads lost on Gemma's 262 144-row unembedding).
// Needs subgroups of at least 8 lanes.
// Y, Params and `store4` come from the composed store file: matvec_store.wgsl (plain), or
// matvec_store_epilogue.wgsl (fused with the elementwise stage after the matmul).
@group(0) @binding(1) var X: texture_2d<f32>;

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 128u;  // 32 threads x ROWS_PER_THREAD
const TOKENS_PER_WG: u32 = 1u;

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t = lin / row_groups;
    if (t >= P.T) {
        return;  // uniform per workgroup
    }
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    let quads = (P.rows + 3u) / 4u;
    let q = min(r / 4u, quads - 1u);  // quads past the end repeat the last, never stored
    let words = P.K / 4u;
    let gpr = P.K / GROUP;
    let s = quads * words + 2u * q * gpr;
    let xl = lane & 7u;  // this lane's first vec4 of X (x_offset is the fill's)
    var acc = vec4<f32>();
    // 32 values (8 words) per step; a group is 32 values, or 16 (Q6_K: two per step)
    for (var c = 0u; c < P.K / 32u; c++) {
        let g0 = c * 32u / GROUP;
        let sa = bitcast<vec4<f32>>(slot(s + 2u * g0));
        let oa = bitcast<vec4<f32>>(slot(s + 2u * g0 + 1u));
        var sb = sa;
        var ob = oa;
        if (GROUP < 32u) {
            let g1 = (c * 32u + 16u) / GROUP;
            sb = bitcast<vec4<f32>>(slot(s + 2u * g1));
            ob = bitcast<vec4<f32>>(slot(s + 2u * g1 + 1u));
        }
        let v = textureLoad(X, vec2<u32>(xl + 8u * c, t), 0);
        let w = q * words + 8u * c;
        acc += subgroupBroadcast(v, 0u) * quad4(slot(w), sa, oa);
        acc += subgroupBroadcast(v, 1u) * quad4(slot(w + 1u), sa, oa);
        acc += subgroupBroadcast(v, 2u) * quad4(slot(w + 2u), sa, oa);
        acc += subgroupBroadcast(v, 3u) * quad4(slot(w + 3u), sa, oa);
        acc += subgroupBroadcast(v, 4u) * quad4(slot(w + 4u), sb, ob);
        acc += subgroupBroadcast(v, 5u) * quad4(slot(w + 5u), sb, ob);
        acc += subgroupBroadcast(v, 6u) * quad4(slot(w + 6u), sb, ob);
        acc += subgroupBroadcast(v, 7u) * quad4(slot(w + 7u), sb, ob);
    }
    store4(t * P.y_stride + P.row0 + r, r, acc);
}
