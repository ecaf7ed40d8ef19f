// Y[t, h * d + i] = C[t, h * d + i] * sigmoid(QF[t, h * 2d + d + i]): each head's gate is the
// second half of its q_full block. One thread an element.
struct Params { n: u32, head_dim: u32, n_heads: u32, _p0: u32 }
@group(0) @binding(0) var<storage, read> C: array<f32>;
@group(0) @binding(1) var<storage, read> QF: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.n) { return; }
    let w = P.n_heads * P.head_dim;
    let t = k / w;
    let h = (k % w) / P.head_dim;
    let i = k % P.head_dim;
    let g = QF[t * 2u * w + (2u * h + 1u) * P.head_dim + i];
    Y[k] = C[k] / (1.0 + exp(-g));
}
