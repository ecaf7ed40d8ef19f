// How the decode matvec (matmul_matvec.wgsl) stores its row quad: into Y, as every matmul driver.
// `i` is the quad's first element relative to y_offset; rows past P.rows are not stored.
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params { K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32 }
@group(0) @binding(3) var<uniform> P: Params;

fn store4(i: u32, r: u32, acc: vec4<f32>) {
    let yb = P.y_offset + i;
    if (r < P.rows) { Y[yb] = acc.x; }
    if (r + 1u < P.rows) { Y[yb + 1u] = acc.y; }
    if (r + 2u < P.rows) { Y[yb + 2u] = acc.z; }
    if (r + 3u < P.rows) { Y[yb + 3u] = acc.w; }
}
