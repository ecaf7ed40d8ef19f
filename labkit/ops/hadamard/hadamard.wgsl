// Y = each block of n values of X times the orthonormal Walsh-Hadamard matrix of size n (n a power of 2):
// y[i] = sum_j (-1)^popcount(i & j) x[j] / sqrt(n), one thread an output value (ggml's fwht, summed directly).
struct Params { count: u32, n: u32, x_offset: u32, y_offset: u32 }
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * 64u;
    if (k >= P.count) { return; }
    let i = k % P.n;
    let start = P.x_offset + k - i;
    var acc = 0.0;
    for (var j = 0u; j < P.n; j++) {
        let sign = 1.0 - 2.0 * f32(countOneBits(i & j) & 1u);
        acc += sign * X[start + j];
    }
    Y[P.y_offset + k] = acc / sqrt(f32(P.n));
}
