// Fused tiled attention (online softmax over key chunks): one workgroup per (tile of TILE
// queries, head). The tile's q rows are loaded once into workgroup memory; for each chunk of 64
// keys, thread j scores key j against every query of the tile, then every thread folds the
// chunk into its running max, sum and its head_dim/64 output lanes. Scores and probabilities are
// not materialized (those stages are not captured), as with the streaming tier.
// Bindings and Params: attn_streaming.wgsl's (Q, K cache, V cache, C, SINKS, P); a sink starts
// the running max and sum as it does there.
// Dispatch: ceil(T / TILE) * n_heads workgroups, linear id w -> tile w % n_tiles, head
// w / n_tiles; workgroups past the last head return at once.
// Limits: head_dim <= 256 (4 lanes of 64), TILE * head_dim floats of workgroup memory.
// llvmpipe ends an invocation's loops after 65535 turns in all (tests/ops/test_loop_turns.py): the
// score's dot over head_dim is written out in 16-value steps and the two loops over a chunk's keys
// take 4 keys a turn, so a chunk costs a thread about TILE x 2 x CHUNK / 4 turns, not
// TILE x (head_dim + 2 x CHUNK); labkit.ops.attn_ctx.loop_turns counts them and attn_ctx.plan refuses
// a context past the bound on llvmpipe.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
@group(0) @binding(4) var<storage, read> SINKS: array<f32>;  // [n_heads], read where P.sinks
@group(0) @binding(5) var<uniform> P: Params;

const TILE: u32 = 8u;
const CHUNK: u32 = 64u;
const LANES: u32 = 4u;  // head_dim / 64, at most
const NEG_INF: f32 = -3.4028235e38;

var<workgroup> q_tile: array<f32, 2048>;  // TILE * 256
var<workgroup> scores: array<f32, 512>;   // TILE * CHUNK

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n_tiles = (P.T + TILE - 1u) / TILE;
    let w = wid.x + wid.y * nwg.x;
    let h = w / n_tiles;
    if (h >= P.n_heads) { return; }
    let t0 = (w % n_tiles) * TILE;
    let hd = P.head_dim;
    let row = P.n_heads * hd;
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let stride = P.n_kv_heads * hd;

    for (var i = lid; i < TILE * hd; i += 64u) {
        let t = t0 + i / hd;
        q_tile[i] = select(0.0, Q[t * row + h * hd + i % hd], t < P.T);
    }
    var m: array<f32, 8>;
    var l: array<f32, 8>;
    var acc: array<f32, 32>;  // [TILE][LANES]
    for (var i = 0u; i < TILE; i++) { m[i] = NEG_INF; l[i] = 0.0; }
    if (P.sinks != 0u) { for (var i = 0u; i < TILE; i++) { m[i] = SINKS[h]; l[i] = 1.0; } }
    for (var i = 0u; i < TILE * LANES; i++) { acc[i] = 0.0; }
    workgroupBarrier();

    // keys up to the last query of the tile (causal)
    let last_q = min(t0 + TILE, P.T) - 1u;
    let n_keys = P.n_past + last_q + 1u;
    for (var c0 = 0u; c0 < n_keys; c0 += CHUNK) {
        let s = c0 + lid;
        for (var i = 0u; i < TILE; i++) {
            let qpos = P.n_past + t0 + i;
            var x = NEG_INF;
            let visible = t0 + i < P.T && s <= qpos && !(P.window > 0u && qpos - s >= P.window);
            if (visible) {
                let kb = s * stride + kvh * hd;
                let dot = tile_dot(i * hd, kb, hd);
                x = softcap(dot * P.scale, P.softcap);
            }
            scores[i * CHUNK + lid] = x;
        }
        workgroupBarrier();
        let n_here = min(CHUNK, n_keys - c0);
        for (var i = 0u; i < TILE; i++) {
            var cmax = NEG_INF;  // 4 keys a turn: past n_here a chunk's scores are -inf
            for (var j = 0u; j < n_here; j += 4u) { cmax = max(cmax, max4(i * CHUNK + j)); }
            if (cmax == NEG_INF) { continue; }  // nothing visible to this query in this chunk
            let m_new = max(m[i], cmax);
            let corr = exp(m[i] - m_new);
            l[i] *= corr;
            for (var r = 0u; r < LANES; r++) { acc[i * LANES + r] *= corr; }
            for (var j = 0u; j < n_here; j += 4u) {  // 4 keys a turn, as above
                let sj = i * CHUNK + j;
                let vb = (c0 + j) * stride + kvh * hd;
                l[i] += fold(&acc, i, scores[sj], m_new, vb, lid, hd) + fold(&acc, i, scores[sj + 1u], m_new, vb + stride, lid, hd)
                      + fold(&acc, i, scores[sj + 2u], m_new, vb + 2u * stride, lid, hd)
                      + fold(&acc, i, scores[sj + 3u], m_new, vb + 3u * stride, lid, hd);
            }
            m[i] = m_new;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TILE; i++) {
        let t = t0 + i;
        if (t >= P.T) { break; }
        for (var r = 0u; r < LANES; r++) {
            let d = lid + 64u * r;
            if (d < hd) { C[t * row + h * hd + d] = acc[i * LANES + r] / l[i]; }
        }
    }
}

// Gemma 2's attention logit soft-capping, before the mask: cap * tanh(x / cap), off when cap is 0 (tanh argument clamped to ±15, as in glu.wgsl).
fn softcap(x: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
    return x;
}

// 16 products of the tile's q (from qt) and K (from kb), from e on (e + 16 <= head_dim)
fn dot16(qt: u32, kb: u32, e: u32) -> f32 {
    var x = 0.0;
    for (var i = 0u; i < 16u; i++) { x += q_tile[qt + e + i] * K[kb + e + i]; }  // constant: unrolled
    return x;
}

// a query of the tile (its q from qt) . key kb over head_dim <= 256: 16-value steps written out
fn tile_dot(qt: u32, kb: u32, hd: u32) -> f32 {
    var x = 0.0;
    if (hd >= 16u) { x += dot16(qt, kb, 0u); }
    if (hd >= 32u) { x += dot16(qt, kb, 16u); }
    if (hd >= 48u) { x += dot16(qt, kb, 32u); }
    if (hd >= 64u) { x += dot16(qt, kb, 48u); }
    if (hd >= 80u) { x += dot16(qt, kb, 64u); }
    if (hd >= 96u) { x += dot16(qt, kb, 80u); }
    if (hd >= 112u) { x += dot16(qt, kb, 96u); }
    if (hd >= 128u) { x += dot16(qt, kb, 112u); }
    if (hd >= 144u) { x += dot16(qt, kb, 128u); }
    if (hd >= 160u) { x += dot16(qt, kb, 144u); }
    if (hd >= 176u) { x += dot16(qt, kb, 160u); }
    if (hd >= 192u) { x += dot16(qt, kb, 176u); }
    if (hd >= 208u) { x += dot16(qt, kb, 192u); }
    if (hd >= 224u) { x += dot16(qt, kb, 208u); }
    if (hd >= 240u) { x += dot16(qt, kb, 224u); }
    if (hd >= 256u) { x += dot16(qt, kb, 240u); }
    for (var e = hd / 16u * 16u; e < hd; e++) { x += q_tile[qt + e] * K[kb + e]; }
    return x;
}

fn max4(j: u32) -> f32 {
    return max(max(scores[j], scores[j + 1u]), max(scores[j + 2u], scores[j + 3u]));
}

// One key's share of query i's context: p = exp(x - m) onto this thread's output lanes from the
// key's V row at vb; a masked key (x = -inf) adds nothing and reads no V. Returns p.
fn fold(acc: ptr<function, array<f32, 32>>, i: u32, x: f32, m: f32, vb: u32, lid: u32, hd: u32) -> f32 {
    if (x == NEG_INF) { return 0.0; }
    let p = exp(x - m);
    for (var r = 0u; r < LANES; r++) {  // constant: unrolled
        let d = lid + 64u * r;
        if (d < hd) { (*acc)[i * LANES + r] += p * V[vb + d]; }
    }
    return p;
}
