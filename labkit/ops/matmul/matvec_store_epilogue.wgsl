// The decode matvec fused with the elementwise stage after it (labkit.gpu.fusion): each row's
// value goes into Y, as unfused, and Z = epilogue(y, e) into the next stage's region, E being
// that stage's other input. One dispatch then writes both named stages, and the next stage's
// own dispatch (about 50-100 us on lavapipe, whatever its size) is not needed.
// Composed with a file defining `fn epilogue(y: f32, e: f32) -> f32` (epilogue_add, epilogue_glu).
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
struct Params {
    K: u32, rows: u32, T: u32, row0: u32, x_offset: u32, x_stride: u32, y_offset: u32, y_stride: u32,
    e_offset: u32, z_offset: u32, act: u32, y_first: u32,
}
@group(0) @binding(3) var<uniform> P: Params;
@group(0) @binding(4) var<storage, read> E: array<f32>;
@group(0) @binding(5) var<storage, read_write> Z: array<f32>;

fn store1(i: u32, v: f32) {
    Y[P.y_offset + i] = v;
    Z[P.z_offset + i] = epilogue(v, E[P.e_offset + i]);
}

fn store4(i: u32, r: u32, acc: vec4<f32>) {
    if (r < P.rows) { store1(i, acc.x); }
    if (r + 1u < P.rows) { store1(i + 1u, acc.y); }
    if (r + 2u < P.rows) { store1(i + 2u, acc.z); }
    if (r + 3u < P.rows) { store1(i + 3u, acc.w); }
}
