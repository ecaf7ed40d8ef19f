// Each selected expert's bias (ggml's add_id): for row i of the [T·k, n] product, the bias of the
// expert its slot picked: Y[y_offset + i·n + c] = A[i·n + c] + B[IDS[ids_offset + i]·n + c].
// Interface: @binding(0) A [T·k, n], @binding(1) B [n_expert, n], @binding(2) Y, @binding(3) IDS
// (u32 expert ids, [T, k]), @binding(4) P. One thread per element.
struct Params { total: u32, n: u32, ids_offset: u32, y_offset: u32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;
@group(0) @binding(4) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= P.total) { return; }
    let slot = i / P.n;
    Y[P.y_offset + i] = A[i] + B[IDS[P.ids_offset + slot] * P.n + i % P.n];
}
