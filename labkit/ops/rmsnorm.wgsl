// RMSNorm over groups: Y[g, i] = X[g, i] / sqrt(mean_i(X[g, :]^2) + eps) * W[i]
// A group is a whole hidden vector (attn_norm, ffn_norm, ...) or one head (gemma's q_norm/k_norm).
// Interface (a variant keeps these bindings and this struct):
//   @binding(0) X: array<f32>  [n_groups, group]
//   @binding(1) W: array<f32>  [group]  (the GGUF norm weight, used as stored)
//   @binding(2) Y: array<f32>  [n_groups, group]
//   @binding(3) P: Params      one workgroup of 64 per group, linear id over a 2-D grid
struct Params { n_groups: u32, group: u32, eps: f32, _pad: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * nwg.x;
    let live = g < P.n_groups;
    let base = g * P.group;
    var s = 0.0;
    if (live) {
        for (var i = li; i < P.group; i += 64u) { let v = X[base + i]; s += v * v; }
    }
    partial[li] = s;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if (li < stride) { partial[li] += partial[li + stride]; }
        workgroupBarrier();
    }
    if (!live) { return; }
    let inv = 1.0 / sqrt(partial[0] / f32(P.group) + P.eps);
    for (var i = li; i < P.group; i += 64u) { Y[base + i] = X[base + i] * inv * W[i]; }
}
