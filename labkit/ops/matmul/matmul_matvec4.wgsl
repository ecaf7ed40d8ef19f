// Matmul driver for a few tokens (2 to 4: a batch's decode step, a short verification) on repacked
// weights: matmul_matvec.wgsl's thread and geometry, each thread a quad of rows for up to 4 tokens.
// A weight word is loaded and decoded once for the workgroup's tokens, not once per token, and each
// token's sums run in matvec's order, so a token's row is the bits matvec gives it alone (a batch
// of decode steps is batch invariant in its matmuls).
// Same bindings, Params, X texture and store file as matmul_matvec.wgsl.
@group(0) @binding(1) var X: texture_2d<f32>;

const ROWS_PER_THREAD: u32 = 4u;
const ROWS_PER_WG: u32 = 128u;  // 32 threads x ROWS_PER_THREAD
const TOKENS_PER_WG: u32 = 4u;

// token j's vec4 c of X (this lane's of 8): a token past the pass reads the last one's (never stored)
fn xv(j: u32, c: u32, t0: u32, xl: u32) -> vec4<f32> {
    return textureLoad(X, vec2<u32>(xl + 8u * c, min(t0 + j, P.T - 1u)), 0);
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let lin = wid.x + wid.y * nwg.x;
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t0 = (lin / row_groups) * TOKENS_PER_WG;
    if (t0 >= P.T) {
        return;  // uniform per workgroup
    }
    let r = (lin % row_groups) * ROWS_PER_WG + li * ROWS_PER_THREAD;
    let quads = (P.rows + 3u) / 4u;
    let q = min(r / 4u, quads - 1u);  // quads past the end repeat the last, never stored
    let words = P.K / 4u;
    let gpr = P.K / GROUP;
    let s = quads * words + 2u * q * gpr;
    let xl = lane & 7u;
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
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
        let v0 = xv(0u, c, t0, xl);
        let v1 = xv(1u, c, t0, xl);
        let v2 = xv(2u, c, t0, xl);
        let v3 = xv(3u, c, t0, xl);
        let w = q * words + 8u * c;
        var wq: mat4x4<f32>;
        wq = quad4(slot(w + 0u), sa, oa);
        a0 += subgroupBroadcast(v0, 0u) * wq; a1 += subgroupBroadcast(v1, 0u) * wq;
        a2 += subgroupBroadcast(v2, 0u) * wq; a3 += subgroupBroadcast(v3, 0u) * wq;
        wq = quad4(slot(w + 1u), sa, oa);
        a0 += subgroupBroadcast(v0, 1u) * wq; a1 += subgroupBroadcast(v1, 1u) * wq;
        a2 += subgroupBroadcast(v2, 1u) * wq; a3 += subgroupBroadcast(v3, 1u) * wq;
        wq = quad4(slot(w + 2u), sa, oa);
        a0 += subgroupBroadcast(v0, 2u) * wq; a1 += subgroupBroadcast(v1, 2u) * wq;
        a2 += subgroupBroadcast(v2, 2u) * wq; a3 += subgroupBroadcast(v3, 2u) * wq;
        wq = quad4(slot(w + 3u), sa, oa);
        a0 += subgroupBroadcast(v0, 3u) * wq; a1 += subgroupBroadcast(v1, 3u) * wq;
        a2 += subgroupBroadcast(v2, 3u) * wq; a3 += subgroupBroadcast(v3, 3u) * wq;
        wq = quad4(slot(w + 4u), sb, ob);
        a0 += subgroupBroadcast(v0, 4u) * wq; a1 += subgroupBroadcast(v1, 4u) * wq;
        a2 += subgroupBroadcast(v2, 4u) * wq; a3 += subgroupBroadcast(v3, 4u) * wq;
        wq = quad4(slot(w + 5u), sb, ob);
        a0 += subgroupBroadcast(v0, 5u) * wq; a1 += subgroupBroadcast(v1, 5u) * wq;
        a2 += subgroupBroadcast(v2, 5u) * wq; a3 += subgroupBroadcast(v3, 5u) * wq;
        wq = quad4(slot(w + 6u), sb, ob);
        a0 += subgroupBroadcast(v0, 6u) * wq; a1 += subgroupBroadcast(v1, 6u) * wq;
        a2 += subgroupBroadcast(v2, 6u) * wq; a3 += subgroupBroadcast(v3, 6u) * wq;
        wq = quad4(slot(w + 7u), sb, ob);
        a0 += subgroupBroadcast(v0, 7u) * wq; a1 += subgroupBroadcast(v1, 7u) * wq;
        a2 += subgroupBroadcast(v2, 7u) * wq; a3 += subgroupBroadcast(v3, 7u) * wq;
    }
    let acc = array<vec4<f32>, 4>(a0, a1, a2, a3);
    for (var j = 0u; j < TOKENS_PER_WG; j++) {
        if (t0 + j < P.T) {
            store4((t0 + j) * P.y_stride + P.row0 + r, r, acc[j]);
        }
    }
}
