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
                var dot = 0.0;
                for (var e = 0u; e < hd; e++) { dot += q_tile[i * hd + e] * K[kb + e]; }
                x = softcap(dot * P.scale, P.softcap);
            }
            scores[i * CHUNK + lid] = x;
        }
        workgroupBarrier();
        let n_here = min(CHUNK, n_keys - c0);
        for (var i = 0u; i < TILE; i++) {
            var cmax = NEG_INF;
            for (var j = 0u; j < n_here; j++) { cmax = max(cmax, scores[i * CHUNK + j]); }
            if (cmax == NEG_INF) { continue; }  // nothing visible to this query in this chunk
            let m_new = max(m[i], cmax);
            let corr = exp(m[i] - m_new);
            l[i] *= corr;
            for (var r = 0u; r < LANES; r++) { acc[i * LANES + r] *= corr; }
            for (var j = 0u; j < n_here; j++) {
                let x = scores[i * CHUNK + j];
                if (x == NEG_INF) { continue; }
                let p = exp(x - m_new);
                l[i] += p;
                let vb = (c0 + j) * stride + kvh * hd;
                for (var r = 0u; r < LANES; r++) {
                    let d = lid + 64u * r;
                    if (d < hd) { acc[i * LANES + r] += p * V[vb + d]; }
                }
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
