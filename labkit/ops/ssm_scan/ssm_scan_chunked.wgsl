// Mamba-2's selective scan, the chunked form (state-space duality, how engines run a prompt): one workgroup
// a head h, the pass's tokens in chunks of CHUNK, the head's state rows S[h, p, :] carried between them.
// Inside a chunk, with la_t = log_decay(step(DT[t, h]), A[h]) and L its cumulative sum, the part that does
// not depend on the state is computed once for the head, in workgroup memory:
//   CBD[t][s] = (C_t·B_s) e^(L_t - L_s) dt'_s,  s ≤ t
// then each thread takes rows p of the state (p = lid, lid + 64, ...) through the chunk:
//   Y[t, h, p] = e^(L_t) (C_t·S_p) + Σ_s CBD[t][s] x_s[p];   S_p ← e^(L_last) S_p + Σ_s e^(L_last - L_s) dt'_s x_s[p] B_s
// The same numbers as the recurrent form (ssm_scan.wgsl) to f32 rounding. Composed before four parts: step,
// decay, the state a pass starts from (as ssm_scan.wgsl's) and the state a chunk starts from
// (ssm_scan_carry.wgsl), each correct or a fault's. Same interface as ssm_scan.wgsl.
struct Params { T: u32, n_head: u32, head_dim: u32, d_state: u32, n_group: u32, channels: u32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read> XBC: array<f32>;
@group(0) @binding(1) var<storage, read> DT: array<f32>;
@group(0) @binding(2) var<storage, read> A: array<f32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;

const CHUNK: u32 = 16u;
var<workgroup> L: array<f32, CHUNK>;  // cumulative log-decay
var<workgroup> dts: array<f32, CHUNK>;  // dt' = step(dt)
var<workgroup> CBD: array<f32, 256>;  // CHUNK x CHUNK

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;  // uniform across the workgroup: every thread reaches every barrier
    let d_inner = P.n_head * P.head_dim;
    let N = P.d_state;
    let g = h / (P.n_head / P.n_group);
    let b0 = d_inner + g * N;
    let c0 = d_inner + P.n_group * N + g * N;
    for (var p = lid; p < P.head_dim; p += 64u) {
        let base = (h * P.head_dim + p) * N;
        for (var n = 0u; n < N; n++) { S[base + n] = start(S[base + n]); }
    }
    let n_chunks = (P.T + CHUNK - 1u) / CHUNK;
    for (var c = 0u; c < n_chunks; c++) {
        let t0 = c * CHUNK;
        let len = min(CHUNK, P.T - t0);
        if (lid == 0u) {
            var acc = 0.0;
            for (var i = 0u; i < CHUNK; i++) {
                var sp = 0.0;
                if (i < len) {
                    sp = step(DT[(t0 + i) * P.n_head + h]);
                    acc += log_decay(sp, A[h]);
                }
                dts[i] = sp;
                L[i] = acc;
            }
        }
        workgroupBarrier();
        for (var e = lid; e < CHUNK * CHUNK; e += 64u) {
            let t = e / CHUNK;
            let s = e % CHUNK;
            var v = 0.0;
            if (s <= t && t < len) {
                var cb = 0.0;
                for (var n = 0u; n < N; n++) { cb += XBC[(t0 + t) * P.channels + c0 + n] * XBC[(t0 + s) * P.channels + b0 + n]; }
                v = cb * exp(L[t] - L[s]) * dts[s];
            }
            CBD[e] = v;
        }
        workgroupBarrier();
        let last = L[len - 1u];
        for (var p = lid; p < P.head_dim; p += 64u) {
            let row = h * P.head_dim + p;
            let base = row * N;
            for (var n = 0u; n < N; n++) { S[base + n] = carried(S[base + n], c); }
            for (var t = 0u; t < len; t++) {
                var cs = 0.0;
                for (var n = 0u; n < N; n++) { cs += XBC[(t0 + t) * P.channels + c0 + n] * S[base + n]; }
                var y = exp(L[t]) * cs;
                for (var s = 0u; s <= t; s++) { y += CBD[t * CHUNK + s] * XBC[(t0 + s) * P.channels + row]; }
                Y[(t0 + t) * d_inner + row] = y;
            }
            for (var n = 0u; n < N; n++) {
                var add = 0.0;
                for (var s = 0u; s < len; s++) {
                    add += exp(last - L[s]) * dts[s] * XBC[(t0 + s) * P.channels + row] * XBC[(t0 + s) * P.channels + b0 + n];
                }
                S[base + n] = exp(last) * S[base + n] + add;
            }
        }
        workgroupBarrier();
    }
}
