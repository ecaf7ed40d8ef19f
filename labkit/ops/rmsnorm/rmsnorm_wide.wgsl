// RMSNorm over groups, a workgroup of 256 threads a group: a real GPU's driver. Same interface,
// formula and parts (inv_rms, weight) as rmsnorm.wgsl, whose 8 threads a group take a 4096-wide
// decode row as 512 loads one after another (0.23 ms a norm on an H200). Here each thread loads
// every 256th value and the partial sums meet in workgroup memory: on a GPU the barriers are cheap,
// on llvmpipe they are not (coroutines), so the CPU adapter keeps rmsnorm.wgsl.
struct Params { n_groups: u32, group: u32, eps: f32, _pad: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const WG: u32 = 256u;
const GROUPS_PER_WG: u32 = 1u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * nwg.x;  // uniform across the workgroup: the barriers below are reached by all
    let live = g < P.n_groups;
    let base = g * P.group;
    var s = 0.0;
    if (live) {
        for (var i = li; i < P.group; i += WG) { let v = X[base + i]; s += v * v; }
    }
    partial[li] = s;
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        workgroupBarrier();
        if (li < half) { partial[li] += partial[li + half]; }
    }
    workgroupBarrier();
    let inv = inv_rms(partial[0] / f32(P.group), P.eps);
    if (!live) { return; }
    for (var i = li; i < P.group; i += WG) { Y[base + i] = X[base + i] * inv * weight(W[i]); }
}
