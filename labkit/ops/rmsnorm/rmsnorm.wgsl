// RMSNorm over groups: Y[g, i] = X[g, i] * inv_rms(mean_i(X[g, :]^2)) * weight(W[i])
// A group is a whole hidden vector (attn_norm, ffn_norm, ...) or one head (gemma's q_norm/k_norm).
// Composed before a part that gives inv_rms and weight: rmsnorm_exact.wgsl, or a faulty variant's.
// Interface:
//   @binding(0) X: array<f32>  [n_groups, group]
//   @binding(1) W: array<f32>  [group]  (the GGUF norm weight, used as stored)
//   @binding(2) Y: array<f32>  [n_groups, group]
//   @binding(3) P: Params      GROUPS_PER_WG groups a workgroup of 64, linear id over a 2-D grid
// A group's GROUP_THREADS (8) threads reduce through lanes8.wgsl's sum8 (subgroup shuffles: any subgroup
// of 8 or more consecutive invocations holds whole groups), not workgroup memory and barriers,
// which llvmpipe runs as coroutines (softmax.wgsl does the same).
struct Params { n_groups: u32, group: u32, eps: f32, _pad: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const GROUP_THREADS: u32 = 8u;
const GROUPS_PER_WG: u32 = 8u;  // 64 / GROUP_THREADS

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * nwg.x) * GROUPS_PER_WG + li / GROUP_THREADS;
    let lane = li % GROUP_THREADS;
    let live = g < P.n_groups;  // the same for a group's 8 threads
    let base = g * P.group;
    var s = 0.0;
    if (live) {
        for (var i = lane; i < P.group; i += GROUP_THREADS) { let v = X[base + i]; s += v * v; }
    }
    let inv = inv_rms(sum8(s) / f32(P.group), P.eps);
    if (!live) { return; }
    for (var i = lane; i < P.group; i += GROUP_THREADS) { Y[base + i] = X[base + i] * inv * weight(W[i]); }
}
