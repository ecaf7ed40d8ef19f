// What the split-K decode drivers on the blocks layout share (blocks_<fmt>_splitk.wgsl), made for
// real GPUs: a workgroup of 64 threads owns 4 rows of one token and splits their blocks between
// its threads; each thread reads the X values of its own part of the row (no subgroup sharing),
// and the 64 partial sums meet in a shared-memory tree. quad_rows.wgsl gives a thread 4 whole
// rows: on lavapipe that is the fast shape, but on a GPU it leaves rows / 128 workgroups of 32
// threads (32 for a 4096-row matrix), far too few to keep the memory system busy.
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;

const ROWS_PER_WG: u32 = 4u;
const TOKENS_PER_WG: u32 = 1u;
const SPLIT: u32 = 64u;  // threads per workgroup, each taking every SPLIT-th part of the rows

// 32 consecutive values of X, read directly
fn x32_at(i: u32) -> Vec8 {
    return Vec8(X[i], X[i + 1u], X[i + 2u], X[i + 3u], X[i + 4u], X[i + 5u], X[i + 6u], X[i + 7u]);
}

// A workgroup's work: its token t, its first row r, the first texel of each of its 4 rows (rows
// past the end read the last row, never stored), and its token's first vec4 of X. `live` is
// false past the last token (uniform per workgroup).
struct SplitRows { live: bool, t: u32, r: u32, b0: u32, b1: u32, b2: u32, b3: u32, xb: u32 }

fn split_rows(lin: u32, row_texels: u32, unit: u32) -> SplitRows {
    let row_groups = (P.rows + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    let t = lin / row_groups;
    let r = (lin % row_groups) * ROWS_PER_WG;
    let last = P.rows - 1u;
    return SplitRows(t < P.T, t, r, row_start(min(r, last), row_texels, unit), row_start(min(r + 1u, last), row_texels, unit),
                     row_start(min(r + 2u, last), row_texels, unit), row_start(min(r + 3u, last), row_texels, unit),
                     (P.x_offset + t * P.x_stride) / 4u);
}

var<workgroup> part: array<vec4<f32>, SPLIT>;

// The 4 rows' sums: every thread's partial sums added in a tree, stored by thread 0.
fn reduce_store(li: u32, acc: vec4<f32>, s: SplitRows) {
    part[li] = acc;
    workgroupBarrier();
    for (var stride = SPLIT / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            part[li] += part[li + stride];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        store4(s.t * P.y_stride + P.row0 + s.r, s.r, part[0]);
    }
}

// The driver: part i of the rows (64 values of a block, at texel offset o) is the format's
// `part_sum` (blocks_k_splitk.wgsl, blocks_q6_k_splitk.wgsl); thread li takes parts li, li + SPLIT, ...
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let s = split_rows(wid.x + wid.y * nwg.x, P.K / 256u * BLOCK_TEXELS, BLOCK_TEXELS);
    if (!s.live) {
        return;  // uniform per workgroup
    }
    var acc = vec4<f32>();
    for (var i = li; i < P.K / 64u; i += SPLIT) {
        acc += part_sum(s, i, (i / 4u) * QUAD * BLOCK_TEXELS);
    }
    reduce_store(li, acc, s);
}
