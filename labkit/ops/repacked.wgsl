// What the drivers on repacked weights share (matmul_tiled.wgsl, matmul_matvec.wgsl): reading
// one slot of the layout repack.wgsl writes. A slot is one vec4<u32>: the same quant word of 4
// rows of a quad; each row has its group's (scale, offset).

// the 4 rows' values in one quant slot: column i is row i's 4 values
fn quad4(u: vec4<u32>, s: vec4<f32>, o: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(s.x * vec4<f32>(unpack4xI8(u.x)) + o.x, s.y * vec4<f32>(unpack4xI8(u.y)) + o.y,
                       s.z * vec4<f32>(unpack4xI8(u.z)) + o.z, s.w * vec4<f32>(unpack4xI8(u.w)) + o.w);
}
