// A grouped RMSNorm with a SiLU gate: per group of `group` values (8 threads a group, lanes8's sum8),
//   gate before:  V = Y * silu(Zg);  Out = V / rms(V) * W
//   gate after:   Out = Y / rms(Y) * W * silu(Zg)
// W holds w_groups groups (the weight's element for group g is W[(g % w_groups) * group + i]).
// Composed before the part that says which side the gate is on (gated_norm_order.wgsl, or a fault's).
// Interface: @binding(0) Y, @binding(1) Zg, @binding(2) W, @binding(3) Out: array<f32>; @binding(4) P.
struct Params { n_groups: u32, group: u32, eps: f32, gate_first: u32, w_groups: u32, _p0: u32, _p1: u32, _p2: u32 }
@group(0) @binding(0) var<storage, read> Y: array<f32>;
@group(0) @binding(1) var<storage, read> Zg: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<f32>;
@group(0) @binding(3) var<storage, read_write> Out: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

const GROUP_THREADS: u32 = 8u;
const GROUPS_PER_WG: u32 = 8u;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * nwg.x) * GROUPS_PER_WG + li / GROUP_THREADS;
    let lane = li % GROUP_THREADS;
    let live = g < P.n_groups;  // the same for a group's 8 threads
    let base = g * P.group;
    let before = gate_before(P.gate_first);
    var s = 0.0;
    if (live) {
        for (var i = lane; i < P.group; i += GROUP_THREADS) {
            var v = Y[base + i];
            if (before) { v *= silu(Zg[base + i]); }
            s += v * v;
        }
    }
    let inv = 1.0 / sqrt(sum8(s) / f32(P.group) + P.eps);
    if (!live) { return; }
    let w0 = (g % P.w_groups) * P.group;
    for (var i = lane; i < P.group; i += GROUP_THREADS) {
        let gate = silu(Zg[base + i]);
        var v = Y[base + i];
        if (before) { v *= gate; }
        var o = v * inv * W[w0 + i];
        if (!before) { o *= gate; }
        Out[base + i] = o;
    }
}
