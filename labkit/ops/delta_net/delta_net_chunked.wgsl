// The gated delta rule, the chunked form (how engines run a prompt): one workgroup a value head h, the
// pass's tokens in chunks of CHUNK, the head's memory M[h] (head_v rows of head_k) carried between them
// in S. Inside a chunk, with gc the cumulative log-decay, everything that does not depend on M is
// computed once for the head, in workgroup memory:
//   A[i][j] = strength(B_i) (k_i·k_j) e^(gc_i - gc_j), j < i;  Tm = (I + A)^-1 (forward substitution)
//   QKD[t][s] = (q_t·k_s) e^(gc_t - gc_s) / sqrt(head_k), s ≤ t
// then each thread takes value rows j of M (j = lid, lid + 64, ...) through the chunk:
//   v_new = Tm (strength(B) v_j - strength(B) e^gc (k·M_j));   o_t = e^(gc_t) (q_t·M_j) / sqrt(head_k) + Σ_s QKD[t][s] v_new_s
//   M_j ← e^(gc_last) M_j + Σ_s e^(gc_last - gc_s) v_new_s k_s
// The same numbers as the recurrent form (delta_net.wgsl) to f32 rounding. Composed before three parts:
// strength (delta_net_strength.wgsl), the state a pass starts from (delta_net_start.wgsl), and the state a
// chunk starts from (delta_net_carry.wgsl), each correct or a fault's. Same interface as delta_net.wgsl.
struct Params { T: u32, n_head: u32, n_k_head: u32, head_k: u32, head_v: u32, channels: u32, v_offset: u32, interleave: u32 }
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> CV: array<f32>;
@group(0) @binding(3) var<storage, read> G: array<f32>;
@group(0) @binding(4) var<storage, read> B: array<f32>;
@group(0) @binding(5) var<storage, read_write> S: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;
@group(0) @binding(7) var<uniform> P: Params;

// the key head value head h reads: tiled (h mod n_k_head, ggml's gated_delta_net) or repeated in place
// (h / (n_head / n_k_head), Qwen3-Next's graph)
fn key_head(h: u32) -> u32 {
    if (P.interleave != 0u) { return h / (P.n_head / P.n_k_head); }
    return h % P.n_k_head;
}

const CHUNK: u32 = 16u;
var<workgroup> gc: array<f32, CHUNK>;
var<workgroup> beta: array<f32, CHUNK>;
var<workgroup> A: array<f32, 256>;  // CHUNK x CHUNK
var<workgroup> Tm: array<f32, 256>;
var<workgroup> QKD: array<f32, 256>;

fn k_at(t: u32, n: u32, h: u32) -> f32 { return K[t * P.n_k_head * P.head_k + key_head(h) * P.head_k + n]; }
fn q_at(t: u32, n: u32, h: u32) -> f32 { return Q[t * P.n_k_head * P.head_k + key_head(h) * P.head_k + n]; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;  // uniform across the workgroup: every thread reaches every barrier
    let N = P.head_k;
    let scale = 1.0 / sqrt(f32(N));
    for (var j = lid; j < P.head_v; j += 64u) {
        let base = (h * P.head_v + j) * N;
        for (var n = 0u; n < N; n++) { S[base + n] = start(S[base + n]); }
    }
    let n_chunks = (P.T + CHUNK - 1u) / CHUNK;
    for (var c = 0u; c < n_chunks; c++) {
        let t0 = c * CHUNK;
        let len = min(CHUNK, P.T - t0);
        if (lid == 0u) {
            var acc = 0.0;
            for (var i = 0u; i < CHUNK; i++) {
                if (i < len) { acc += G[(t0 + i) * P.n_head + h]; beta[i] = strength(B[(t0 + i) * P.n_head + h]); }
                else { beta[i] = 0.0; }
                gc[i] = acc;
            }
        }
        workgroupBarrier();
        for (var e = lid; e < CHUNK * CHUNK; e += 64u) {  // A (strictly lower) and QKD (lower, with the diagonal)
            let i = e / CHUNK;
            let j = e % CHUNK;
            var kk = 0.0;
            var qk = 0.0;
            if (j <= i && i < len) {
                for (var n = 0u; n < N; n++) {
                    let kj = k_at(t0 + j, n, h);
                    kk += k_at(t0 + i, n, h) * kj;
                    qk += q_at(t0 + i, n, h) * kj;
                }
            }
            let d = select(0.0, exp(gc[i] - gc[j]), j <= i && i < len);
            A[e] = select(0.0, beta[i] * kk * d, j < i);
            QKD[e] = qk * d * scale;
        }
        workgroupBarrier();
        for (var i = 0u; i < CHUNK; i++) {  // Tm = (I + A)^-1, row by row: Tm[i][j] = δij - Σ_m<i A[i][m] Tm[m][j]
            if (lid < CHUNK) {
                var v = select(0.0, 1.0, lid == i);
                for (var m = 0u; m < i; m++) { v -= A[i * CHUNK + m] * Tm[m * CHUNK + lid]; }
                Tm[i * CHUNK + lid] = v;
            }
            workgroupBarrier();
        }
        let last = gc[len - 1u];
        for (var j = lid; j < P.head_v; j += 64u) {
            let row = h * P.head_v + j;
            let base = row * N;
            for (var n = 0u; n < N; n++) { S[base + n] = carried(S[base + n], c); }
            var kS: array<f32, CHUNK>;  // what M_j holds under each key of the chunk, and each query reads
            var qS: array<f32, CHUNK>;
            for (var r = 0u; r < len; r++) {
                var ks = 0.0;
                var qs = 0.0;
                for (var n = 0u; n < N; n++) { ks += k_at(t0 + r, n, h) * S[base + n]; qs += q_at(t0 + r, n, h) * S[base + n]; }
                kS[r] = ks;
                qS[r] = qs;
            }
            var vnew: array<f32, CHUNK>;
            for (var s = 0u; s < len; s++) {
                var u = 0.0;
                for (var r = 0u; r < len; r++) {
                    let corr = CV[(t0 + r) * P.channels + P.v_offset + row] - exp(gc[r]) * kS[r];
                    u += Tm[s * CHUNK + r] * beta[r] * corr;
                }
                vnew[s] = u;
            }
            for (var t = 0u; t < len; t++) {
                var o = exp(gc[t]) * qS[t] * scale;
                for (var s = 0u; s <= t; s++) { o += QKD[t * CHUNK + s] * vnew[s]; }
                Y[(t0 + t) * P.n_head * P.head_v + row] = o;
            }
            for (var n = 0u; n < N; n++) {
                var add = 0.0;
                for (var s = 0u; s < len; s++) { add += exp(last - gc[s]) * vnew[s] * k_at(t0 + s, n, h); }
                S[base + n] = exp(last) * S[base + n] + add;
            }
        }
        workgroupBarrier();
    }
}
