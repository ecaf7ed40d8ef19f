// The row drivers' reads and stores (matmul.wgsl, moe_matmul.wgsl): X lanes, a 4x4 block of
// dequantized W, and 4 rows of Y. They use the driver's X, Y and P (P.rows: rows in this window).
// X[i .. i + 3], lanes >= n read as 0 (n = 4 except in the F32/F16 tail block)
fn x4(i: u32, n: u32) -> vec4<f32> {
    let v = vec4<f32>(X[i], X[i + 1u], X[i + 2u], X[i + 3u]);
    return select(vec4<f32>(0.0), v, vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(n));
}

// Columns = values 4j..4j+3 of block ob of the 4 rows starting at bytes rb; lanes >= n are 0
fn w4x4(rb: vec4<u32>, ob: u32, j: u32, n: u32) -> mat4x4<f32> {
    let keep = vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(n);
    let z = vec4<f32>(0.0);
    return mat4x4<f32>(select(z, dequant4(rb.x + ob, j), keep), select(z, dequant4(rb.y + ob, j), keep),
                       select(z, dequant4(rb.z + ob, j), keep), select(z, dequant4(rb.w + ob, j), keep));
}

// Y[yb + i] = v[i] for the rows r + i that exist
fn store4(yb: u32, r: u32, v: vec4<f32>) {
    if (r < P.rows) { Y[yb] = v.x; }
    if (r + 1u < P.rows) { Y[yb + 1u] = v.y; }
    if (r + 2u < P.rows) { Y[yb + 2u] = v.z; }
    if (r + 3u < P.rows) { Y[yb + 3u] = v.w; }
}
